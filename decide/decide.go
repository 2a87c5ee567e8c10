// Package decide turns a validated request into a decision: it asks the
// current policy set which limits apply, groups them by subject, takes the
// request's cost from the store all-or-nothing, and says why it allowed or
// throttled.
//
// decide owns no counters (the store does) and no wire format (package
// server does); it must never panic on any input that passed validation.
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
	"github.com/allot-dev/allot/bucket"
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
	policies atomic.Pointer[policy.Set]
	store    Store
	log      *slog.Logger
	leases   *lease.Manager // nil: leased policies take the exact path
	view     atomic.Pointer[leaseView]
	fallback Fallback // nil: on_store_failure: local fails open
	timeout  time.Duration
	warned   atomic.Int64 // unix ns of the last store-failure warning
	regions  int          // n: a scope: global limit enforces L/n here unless a coordinator share says otherwise
	demand   demand       // exact-path global keys' demand, for DrainDemand
}

// New returns a Decider over store, enforcing set.
func New(store Store, set *policy.Set, log *slog.Logger) *Decider {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Decider{store: store, log: log}
	d.policies.Store(set)
	return d
}

// SetPolicies replaces the policy set. Counters are untouched: a changed
// limit applies to the existing bucket under the same key.
func (d *Decider) SetPolicies(s *policy.Set) {
	d.policies.Store(s)
	d.warnUndividable(s, d.regions)
}

// SetRegions tells the decider that n regions share every `scope: global`
// limit. A global rate limit then enforces the default share L/n
// (algorithm.Spec.Share) as the scripts' numbers, which a coordinator's
// share written into the bucket overrides (token buckets, leased or
// exact); a global quota (fixed window) enforces the whole L against its
// region's count plus the other regions' counts the coordinator writes
// (docs/multi-region.md, "Global quotas"). The exact path then also
// counts the demand of its global keys for DrainDemand. n <= 1 enforces
// L. Call it before serving.
func (d *Decider) SetRegions(n int) {
	d.regions = n
	d.view.Store(nil)
	d.warnUndividable(d.policies.Load(), n)
}

// warnUndividable logs each global rate limit too small to split among n
// regions: Spec.Share gives every region at least 1, so until a
// coordinator writes shares the regions may together admit n per period
// where the policy says less (docs/multi-region.md, Theorem 1). It says
// so rather than refusing the set: the limit is still enforced, loosely.
func (d *Decider) warnUndividable(s *policy.Set, n int) {
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
func (d *Decider) Policies() *policy.Set { return d.policies.Load() }

// ref ties a group item back to the policy and limit it came from, and
// the spec this region enforces for it.
type ref struct {
	policy *policy.Compiled
	limit  *policy.CompiledLimit
	spec   algorithm.Spec
}

// plan is the store work of one check.
type plan struct {
	groups []algorithm.Group
	refs   [][]ref
	shadow []bool
	// regions is n for global policies: see Decider.SetRegions.
	regions int
	// out is the storage decide builds the statuses in (CheckAppend).
	out []Status
	// room is storage for the first group and items, made by the first
	// add: one allocation where the slices cost five. Nil for a check
	// with no exact policy (the leased path allocates nothing here).
	room *planRoom
}

// planRoom holds a typical check's plan: one group of up to two items
// (272 bytes; room for more cost every check its bytes). More spill to
// the heap by append.
type planRoom struct {
	groups [1]algorithm.Group
	refs   [1][]ref
	shadow [1]bool
	items  [2]algorithm.Item
	irefs  [2]ref
	used   int // items (and irefs) handed out
}

func (p *plan) add(subject string, pol *policy.Compiled, cost int64) {
	if p.room == nil && p.groups == nil {
		p.room = &planRoom{}
		p.groups, p.refs, p.shadow = p.room.groups[:0], p.room.refs[:0], p.room.shadow[:0]
	}
	gi := -1
	for i := range p.groups {
		if p.shadow[i] == pol.Shadow && sameSubject(p.groups[i][0].Key, subject) {
			gi = i
			break
		}
	}
	if gi < 0 {
		var items []algorithm.Item
		var irefs []ref
		if r := p.room; r != nil && r.used+len(pol.Limits) <= len(r.items) {
			// Capped at this policy's limits: a later policy appending to
			// the group reallocates rather than overwrite another group.
			n := r.used + len(pol.Limits)
			items, irefs = r.items[r.used:r.used:n], r.irefs[r.used:r.used:n]
			r.used = n
		}
		p.groups = append(p.groups, items)
		p.refs = append(p.refs, irefs)
		p.shadow = append(p.shadow, pol.Shadow)
		gi = len(p.groups) - 1
	}
	for i := range pol.Limits {
		l := &pol.Limits[i]
		spec := regionalSpec(pol, l, p.regions)
		p.groups[gi] = append(p.groups[gi], algorithm.Item{Key: l.Key(subject), Spec: spec, Cost: cost})
		p.refs[gi] = append(p.refs[gi], ref{pol, l, spec})
	}
}

// sameSubject reports whether key is a bucket key of subject.
func sameSubject(key, subject string) bool {
	return bucket.HasSubject(key, subject)
}

// Check decides r.
func (d *Decider) Check(ctx context.Context, r *policy.Request) (Decision, error) {
	return d.CheckAppend(ctx, r, nil)
}

// CheckAppend decides r as Check does, building the decision's statuses
// in the storage of statuses: Decision.Statuses is append(statuses[:0], ...), so
// it shares that array when they fit in its capacity. A caller deciding many
// checks (a batch) gives them one array instead of one allocation each.
func (d *Decider) CheckAppend(ctx context.Context, r *policy.Request, statuses []Status) (Decision, error) {
	set := d.policies.Load()
	tier := set.Tier(r)
	cost := set.Cost(r)
	var buf [8]*policy.Compiled
	matched := set.Match(r, tier, buf[:0])
	if len(matched) == 0 {
		return Decision{Outcome: Allowed}, nil
	}
	p := plan{regions: d.regions, out: statuses[:0]}
	var leasedBuf, exactBuf [8]*policy.Compiled
	leased, exact := leasedBuf[:0], exactBuf[:0]
	for _, pol := range matched {
		if d.leasedLimits(set, pol) != nil {
			leased = append(leased, pol)
			continue
		}
		exact = append(exact, pol)
		p.add(pol.Subject(r, tier), pol, cost)
	}
	var takes []leasedTake
	var failed []*policy.Compiled // decided by on_store_failure
	var cause error
	// A check with leased and exact policies may wait for a refill and
	// then call the store: both share one timeout, from here. (A check
	// with only leased policies, the hot path, reads no clock.)
	var start time.Time
	if len(leased) > 0 && len(p.groups) > 0 && d.timeout > 0 {
		start = time.Now()
	}
	if len(leased) > 0 {
		var takeBuf [8]leasedTake
		var denied bool
		takes, denied, failed, cause = d.takeLeased(ctx, set, leased, r, tier, cost, takeBuf[:0], &p)
		if IsOverloaded(cause) {
			d.giveBack(takes)
			return Decision{}, fmt.Errorf("leased check: %w", cause)
		}
		if denied || (len(p.groups) == 0 && len(failed) == 0) {
			// A leased denial decides without asking the store at all.
			return p.decide(nil, cost, takes), nil
		}
	}
	var results []algorithm.Result
	sctx := ctx
	if len(p.groups) > 0 {
		var cancel context.CancelFunc
		sctx, cancel = d.storeCtxFrom(ctx, start)
		defer cancel()
		var err error
		results, err = d.store.Take(sctx, p.groups)
		switch {
		case IsOverloaded(err):
			d.giveBack(takes)
			return Decision{}, fmt.Errorf("check: %w", err)
		case err != nil:
			failed, cause = append(failed, exact...), err
			p, results = plan{regions: d.regions, out: p.out}, nil
		case len(results) != len(p.groups):
			d.giveBack(takes)
			return Decision{}, fmt.Errorf("store answered %d groups for %d", len(results), len(p.groups))
		}
	}
	if len(failed) > 0 {
		return d.degraded(ctx, sctx, r, tier, cost, &p, results, takes, failed, cause)
	}
	dec := p.decide(results, cost, takes)
	if d.regions > 1 {
		d.demand.record(&p, dec.Outcome == Throttled, cost)
	}
	if dec.Outcome == Throttled {
		d.refund(sctx, &p, results)
		d.giveBack(takes)
	}
	return dec, nil
}

// refund gives back what the allowed groups of a denied request took, so a
// denial by one subject burns no tokens of another.
func (d *Decider) refund(ctx context.Context, p *plan, results []algorithm.Result) {
	d.refundTo(ctx, d.store, p, results)
}

// refundTo gives back to store what the allowed groups of p took. The
// refund outlives the caller's cancellation but not ctx's deadline: it
// shares the take's time budget.
func (d *Decider) refundTo(ctx context.Context, store Store, p *plan, results []algorithm.Result) {
	var back []algorithm.Group
	for i, res := range results {
		if res.Allowed {
			back = append(back, p.groups[i])
		}
	}
	if len(back) == 0 {
		return
	}
	rctx := context.WithoutCancel(ctx)
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		rctx, cancel = context.WithDeadline(rctx, dl)
		defer cancel()
	}
	if err := store.Refund(rctx, back); err != nil {
		// Lost refunds under-admit until the buckets refill; never over-admit.
		d.log.Warn("refund failed", "groups", len(back), "err", err)
	}
}

func (p *plan) decide(results []algorithm.Result, cost int64, takes []leasedTake) Decision {
	var dec Decision
	var deciding *Status
	dec.Statuses, dec.Shadow = leasedStatuses(takes, p.out[:0])
	type take struct {
		i        int // index in dec.Statuses
		cost     int64
		windowed bool
	}
	var taken []take // items of allowed groups
	for gi, res := range results {
		for ii, ir := range res.Items {
			ref := p.refs[gi][ii]
			st := Status{
				PolicyID:   ref.policy.ID,
				LimitName:  ref.limit.Name,
				Limit:      ref.spec.Capacity(),
				Quota:      ref.spec.Limit,
				Remaining:  ir.Remaining,
				ResetAfter: ir.ResetAfter,
				Window:     ref.spec.Period,
				Violated:   !res.Allowed && ir.RetryAfter != 0,
				// Decided by the store itself (a cold key of a leased
				// policy too); the fallback's are marked by markLocal.
				Exact: true,
			}
			if st.Violated {
				st.RetryAfter = ir.RetryAfter
			}
			if p.shadow[gi] {
				if st.Violated {
					dec.Shadow = append(dec.Shadow, st)
				}
				continue
			}
			if res.Allowed {
				taken = append(taken, take{len(dec.Statuses), p.groups[gi][ii].Cost, ref.spec.Algorithm.Windowed()})
			}
			dec.Statuses = append(dec.Statuses, st)
		}
	}
	for i := range dec.Statuses {
		st := &dec.Statuses[i]
		switch {
		case deciding == nil:
			deciding = st
		case st.Violated != deciding.Violated:
			if st.Violated {
				deciding = st
			}
		case st.Violated:
			if later(st.RetryAfter, deciding.RetryAfter) {
				deciding = st
			}
		case st.Remaining < deciding.Remaining:
			deciding = st
		}
	}
	if deciding == nil { // only shadow policies applied
		return dec
	}
	dec.Limit, dec.Remaining, dec.ResetAfter, dec.PolicyID = deciding.Limit, deciding.Remaining, deciding.ResetAfter, deciding.PolicyID
	if deciding.Violated {
		// A denied check gives back what its allowed groups took (Check's
		// refund): report those limits as they will stand, not as they
		// stood between take and refund (another subject's ip-perimeter
		// showed r=375 while Redis held 400).
		for _, t := range taken {
			refunded(&dec.Statuses[t.i], t.cost, t.windowed)
		}
		dec.Outcome = Throttled
		dec.RetryAfter = deciding.RetryAfter
		dec.ResetAfter = deciding.RetryAfter
		dec.Reason = reason(deciding, cost)
		if deciding.RetryAfter == algorithm.Never {
			dec.RetryAfter, dec.ResetAfter = 0, 0
		}
	}
	return dec
}

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
