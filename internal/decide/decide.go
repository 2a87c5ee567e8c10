// Package decide turns a request into a decision: it validates the
// request as sent (Validate), asks the current policy set which limits
// apply, groups them by subject, takes the request's cost from the store
// all-or-nothing (exact policies) or from the node's leases (leased ones),
// applies on_store_failure when the store fails, and says why it allowed
// or throttled. For a quota client (an RLQS stream) that decides its own
// requests, Quota says instead which region buckets it spends, or which
// blanket rule applies (quota.go).
//
// It owns the decision and the per-key counts of global keys' admitted
// and denied tokens, by the exact path and by quota clients' reports
// (QuotaUsage), which the coordinator drains (demand.go), kept only when
// something drains them (Config.Demand). It must not
// keep bucket state (the store and the lease manager do), know a wire
// format (package server does), or panic on any request that passed
// Validate.
package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
)

// Store counts. It takes each group all-or-nothing and can give back what
// it took. region.Store (Redis) and memstore.Store (in process) are the two.
type Store interface {
	Take(ctx context.Context, groups []algorithm.Group) ([]algorithm.Result, error)
	Refund(ctx context.Context, groups []algorithm.Group) error
}

// Outcome is the verdict of a check.
type Outcome int

// Outcomes, numbered as the wire enum.
const (
	Allowed Outcome = iota
	Throttled
	FailedOpen
)

// Status is the state of one limit after a check.
type Status struct {
	PolicyID   string
	LimitName  string
	Limit      int64 // capacity: the burst (default the limit)
	Quota      int64 // tokens per Window: the limit, whatever the burst
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration // violated limits only; algorithm.Never if it never can pass
	Window     time.Duration
	Violated   bool
	Exact      bool
}

// Decision is the answer to one check.
type Decision struct {
	Outcome Outcome
	// Limit, Remaining and ResetAfter describe the deciding limit: the
	// violated one when throttled, else the one with the fewest tokens left.
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration
	Reason     string
	PolicyID   string
	Statuses   []Status
	Shadow     []Status // shadow-mode limits that would have denied
	// Degraded says an enforced policy of the check was decided without
	// the store, by its on_store_failure (open, closed or the local
	// fallback bucket): the answer is not the region's exact count.
	Degraded bool
}

// Decider decides checks against the current policy set. It is safe for
// concurrent use; SetPolicies swaps the set without pausing checks, and a
// check in flight finishes on the set it started with.
type Decider struct {
	state    atomic.Pointer[state]
	store    Store
	log      *slog.Logger
	leases   *lease.Manager // nil: leased policies take the exact path
	fallback Fallback       // nil: on_store_failure: local fails open
	timeout  time.Duration  // the budget of one check's store work; 0: none
	regions  int            // n: a scope: global limit enforces L/n here unless a coordinator share says otherwise
	demand   demand         // global keys' demand by the exact path and quota clients, for DrainDemand
	counts   bool           // Config.Demand: demand is counted
}

// state is a policy set and the lease limits of its leased policies,
// swapped together: a check loads one pointer and finds the lease view
// built for the set it decides on, never one built for another.
type state struct {
	set *policy.Set
	// leased maps the leased policies of set to their lease limits (nil
	// without a lease manager): a policy absent takes the exact path.
	leased map[*policy.Compiled][]*lease.Limit
}

// Config configures a Decider. Every field is fixed for its life but
// Policies, which SetPolicies replaces.
type Config struct {
	// Store counts the exact policies: region.Store (Redis) or
	// memstore.Store (in process).
	Store Store
	// Policies is the set enforced until SetPolicies replaces it.
	Policies *policy.Set
	// Leases routes `precision: leased` policies through a lease manager:
	// they are decided from tokens leased to this node instead of one
	// Redis call per check. Nil (standalone mode): leased policies take
	// the exact path on Store.
	Leases *lease.Manager
	// Fallback decides `on_store_failure: local` policies while Store
	// fails. Nil: they fail open.
	Fallback Fallback
	// Regions is n when n regions share every `scope: global` limit. A
	// global rate limit then enforces the default share L/n
	// (algorithm.Spec.Share) as the scripts' numbers, which a
	// coordinator's share written into the bucket overrides (token
	// buckets, leased or exact); a global quota (fixed window) enforces
	// the whole L against its region's count plus the other regions'
	// counts the coordinator writes (docs/multi-region.md, "Global
	// quotas"). n <= 1 enforces L.
	Regions int
	// Demand says something drains the demand of global keys
	// (DrainDemand: a node's publisher to its region's coordinator, set
	// when it has one): the exact path and quota clients (QuotaUsage)
	// count it then. Without, nothing is counted: the counts are kept
	// until drained, one per key ever seen.
	Demand bool
	// Timeout is the budget of one check's store work: a check that asks
	// the store or waits for a lease refill gets one deadline, this long
	// from its start, for all of it (the refill wait, the take, a refund,
	// the fallback). Zero means none beyond the store's own, as nodes
	// run: the region store judges its shards' stalls itself
	// (--redis-timeout) and sheds what this node cannot get answered
	// (region.DefaultMaxWait, 1 s), and a check whose wall-clock bound passes while
	// the store is healthy would be shed (an overloaded error), not
	// decided by on_store_failure.
	Timeout time.Duration
	// Log receives the decider's warnings; nil discards them. Some come
	// per check or per quota round while the store fails: give it a
	// rate-limited logger (internal/ratelog, as a node does), or an
	// outage floods it.
	Log *slog.Logger
}

// New returns a Decider configured by cfg.
func New(cfg Config) *Decider {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Decider{
		store: cfg.Store, log: log, leases: cfg.Leases, fallback: cfg.Fallback,
		timeout: cfg.Timeout, regions: cfg.Regions, counts: cfg.Demand,
	}
	d.SetPolicies(cfg.Policies)
	return d
}

// SetPolicies replaces the policy set. Counters are untouched: a changed
// limit applies to the existing bucket under the same key. The lease
// limits of the set's leased policies are built here, before the set
// serves its first check; because they are rebuilt for every new set, a
// settings change reaches each key at its next grant, without a restart
// (tokens already granted keep the TTL they were granted with).
func (d *Decider) SetPolicies(s *policy.Set) {
	d.state.Store(&state{set: s, leased: d.leaseView(s)})
	d.warnUndividable(s)
}

// warnUndividable logs each global rate limit too small to split among n
// regions: Spec.Share gives every region at least 1, so until a
// coordinator writes shares the regions may together admit n per period
// where the policy says less (docs/multi-region.md, Theorem 1). It says
// so rather than refusing the set: the limit is still enforced, loosely.
func (d *Decider) warnUndividable(s *policy.Set) {
	n := d.regions
	if s == nil || n <= 1 {
		return
	}
	s.Each(func(pol *policy.Compiled) {
		if !pol.Global {
			return
		}
		for _, l := range pol.Limits {
			if l.Spec.Algorithm == algorithm.FixedWindow {
				continue // a global quota enforces the whole L
			}
			if l.Spec.Limit < int64(n) || l.Spec.Capacity() < int64(n) {
				d.log.Warn("global limit below the number of regions: each region's default share is 1, so they may admit more than the limit until a coordinator writes shares",
					"policy", pol.ID, "limit", l.Name, "limit_value", l.Spec.Limit, "burst", l.Spec.Capacity(), "regions", n)
			}
		}
	})
}

// regionalSpec is the spec this region enforces for limit l of pol.
func regionalSpec(pol *policy.Compiled, l *policy.CompiledLimit, regions int) algorithm.Spec {
	if pol.Global && regions > 1 && l.Spec.Algorithm != algorithm.FixedWindow {
		return l.Spec.Share(regions)
	}
	return l.Spec
}

// Policies returns the set in force.
func (d *Decider) Policies() *policy.Set { return d.state.Load().set }

// refunded moves st to its state after a refund of cost: the tokens come
// back (up to the capacity); for the buckets the time to full shrinks by
// what cost takes to refill (a window's end does not move); a full limit
// has nothing to wait for.
func refunded(st *Status, cost int64, windowed bool) {
	st.Remaining = min(st.Remaining+cost, st.Limit)
	switch {
	case st.Remaining >= st.Limit:
		st.ResetAfter = 0
	case !windowed && st.Quota > 0 && st.Window > 0:
		refill := time.Duration(float64(cost) * float64(st.Window) / float64(st.Quota))
		st.ResetAfter = max(st.ResetAfter-refill, 0)
	}
}

// later orders retry waits, Never being the longest.
func later(a, b time.Duration) bool {
	if b == algorithm.Never {
		return false
	}
	return a == algorithm.Never || a > b
}

func reason(st *Status, cost int64) string {
	if st.RetryAfter == algorithm.Never {
		return fmt.Sprintf("policy %s limit %s: cost %d exceeds its capacity %d", st.PolicyID, st.LimitName, cost, st.Limit)
	}
	return fmt.Sprintf("policy %s limit %s: %d tokens per %v exceeded (cost %d)", st.PolicyID, st.LimitName, st.Limit, st.Window, cost)
}

// ErrStoreUnavailable marks a decision made without the store.
var ErrStoreUnavailable = errors.New("rate-limit store unavailable")

// IsOverloaded reports whether err says the node shed the check: the
// store was healthy but this node could not get an answer within its
// bounds (region's queue full or MaxWait passed, or the caller stopped
// waiting). Such a check is not decided by on_store_failure — the store
// is not failing, the node is — and is answered as an error (gRPC
// UNAVAILABLE, HTTP 503) for the caller to retry elsewhere or later.
func IsOverloaded(err error) bool {
	if err == nil {
		return false // before errors.As, whose target would escape on every check
	}
	var o interface{ Overloaded() bool }
	return errors.As(err, &o) && o.Overloaded()
}

// Seconds rounds d up to whole seconds, as Retry-After wants.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}
