package decide

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
)

// A batch client (an RLQS stream, internal/rlqs) does not ask the node
// per request: it takes a batch of a bucket's requests, decides them
// itself until its next round, and reports what it did. Reserve is that
// take, on the same leases (and so the same region buckets) as Check.

// GrantKind says how a batch client decides a bucket's requests until
// its next round.
type GrantKind int

// Grant kinds.
const (
	// GrantBatch admits Grant.Requests requests, then denies.
	GrantBatch GrantKind = iota
	// GrantAllowAll admits every request: no enforced policy matches, the
	// requests cost nothing, or the store failed and the policies fail
	// open.
	GrantAllowAll
	// GrantDenyAll denies every request: an enforced policy is exact (a
	// batch cannot decide exactly), or the store failed and a policy
	// fails closed.
	GrantDenyAll
	// GrantLocal decides by this node's share of the limit (LocalBurst,
	// LocalRate) while the store fails, for `on_store_failure: local`.
	GrantLocal
)

// Grant is what Reserve answers.
type Grant struct {
	Kind GrantKind
	// Requests is what a GrantBatch admits; 0 when the bucket had nothing
	// to give (RetryAfter then says when it may).
	Requests   int64
	RetryAfter time.Duration
	// Rate is the tightest enforced limit's rate in requests/s (a global
	// limit's default region share): what batch clients of one bucket
	// split. Set for GrantBatch.
	Rate float64
	// LocalBurst and LocalRate (requests/s) are this node's share of the
	// tightest `local` limit, for GrantLocal.
	LocalBurst int64
	LocalRate  float64
	// PolicyID names the deciding policy, Reason says why for anything
	// but a GrantBatch.
	PolicyID string
	Reason   string
	// Degraded: decided by on_store_failure, without the store.
	Degraded bool
	// Unbatchable: a GrantDenyAll because no batch can decide these
	// requests (an exact policy, or a node that leases nothing), not
	// because they are over a limit: a client that can check by RPC
	// should.
	Unbatchable bool
}

// Reserve takes a batch of up to n requests of r's cost, where n, all :=
// size(rate), from the leases of every enforced policy matching r (rate:
// the tightest one's, in requests/s); all (>= n) is what every batch
// taker of r on this node will want this round, so that a refill brings
// it at once and the rest waits on hand (lease.Manager.TakeUpTo). It is
// all-or-nothing across the policies: the batch is what the
// scarcest gave, and the others get the rest back. Shadow policies are
// skipped (they never deny). An exact enforced policy answers
// GrantDenyAll: only leased policies can be decided by a batch. A store
// failure decides by the strictest on_store_failure of the enforced
// policies (closed, then local, then open); an overload (the caller's ctx
// ended while a refill was awaited) is returned as an error.
func (d *Decider) Reserve(ctx context.Context, r *policy.Request, size func(rate float64) (n, all int64)) (Grant, error) {
	st := d.state.Load()
	tier, cost := st.set.Tier(r), st.set.Cost(r)
	var mbuf, ebuf [8]*policy.Compiled
	enforced := ebuf[:0]
	for _, pol := range st.set.Match(r, tier, mbuf[:0]) {
		if !pol.Shadow {
			enforced = append(enforced, pol)
		}
	}
	if len(enforced) == 0 {
		return Grant{Kind: GrantAllowAll, Reason: "no enforced policy matches"}, nil
	}
	if cost == 0 {
		return Grant{Kind: GrantAllowAll, Reason: "the route's requests cost nothing"}, nil
	}
	if d.leases == nil {
		return Grant{Kind: GrantDenyAll, PolicyID: enforced[0].ID, Unbatchable: true, Reason: "this node leases nothing (standalone): a batch client needs leased policies"}, nil
	}
	rate := math.Inf(1)
	for _, pol := range enforced {
		if st.leased[pol] == nil {
			return Grant{Kind: GrantDenyAll, PolicyID: pol.ID, Unbatchable: true,
				Reason: "policy " + pol.ID + " is exact: a batch client can only enforce `precision: leased` policies; check these requests with CheckRateLimit"}, nil
		}
		for i := range pol.Limits {
			rate = min(rate, regionalSpec(pol, &pol.Limits[i], d.regions).Rate()/float64(cost))
		}
	}
	n, all := size(rate)
	n, all = min(n, math.MaxInt64/cost), min(max(all, n), math.MaxInt64/cost)
	if n <= 0 {
		return Grant{Kind: GrantBatch, Rate: rate}, nil
	}
	var takes []lease.Result
	var retry time.Duration
	var subj [256]byte
	var cause error
take:
	for _, pol := range enforced {
		subject := pol.AppendSubject(subj[:0], r, tier)
		for _, ll := range st.leased[pol] {
			res, err := d.leases.TakeUpTo(ctx, ll, subject, n*cost, all*cost)
			if err != nil {
				cause = err
				break take
			}
			takes = append(takes, res)
			retry = max(retry, res.RetryAfter)
			if n = min(n, res.Tokens()/cost); n == 0 {
				break take
			}
		}
	}
	for i := range takes {
		d.leases.GiveBackPart(&takes[i], takes[i].Tokens()-n*cost)
	}
	if cause != nil {
		for i := range takes {
			d.leases.GiveBack(&takes[i])
		}
		if IsOverloaded(cause) {
			return Grant{}, fmt.Errorf("reserve: %w", cause)
		}
		return d.reserveFailed(enforced, cost, cause), nil
	}
	g := Grant{Kind: GrantBatch, Requests: n, Rate: rate}
	if n == 0 {
		g.RetryAfter = retry
	}
	return g, nil
}

// reserveFailed is Reserve's answer when the store failed: the strictest
// on_store_failure among the enforced policies decides.
func (d *Decider) reserveFailed(enforced []*policy.Compiled, cost int64, cause error) Grant {
	if now := time.Now().UnixNano(); now-d.warned.Load() >= int64(warnEvery) {
		d.warned.Store(now)
		d.log.Warn("store failed; reserving by on_store_failure (logged at most every 10s)", "err", cause)
	}
	why := ErrStoreUnavailable.Error()
	var local *Grant
	open := ""
	for _, pol := range enforced {
		switch {
		case pol.OnStoreFailure == policy.FailClosed:
			return Grant{Kind: GrantDenyAll, PolicyID: pol.ID, Degraded: true, Reason: "policy " + pol.ID + ": " + why + " and the policy fails closed"}
		case pol.OnStoreFailure == policy.FailLocal && d.fallback != nil:
			for i := range pol.Limits {
				s := regionalSpec(pol, &pol.Limits[i], d.regions)
				c := s.Capacity()
				share := d.fallback.Share(c)
				g := Grant{Kind: GrantLocal, PolicyID: pol.ID, Degraded: true,
					LocalBurst: share / cost, LocalRate: s.Rate() * float64(share) / float64(c) / float64(cost),
					Reason: why + ", decided by this node's local share (limit / N)"}
				if local == nil || g.LocalRate < local.LocalRate {
					local = &g
				}
			}
		case open == "":
			open = pol.ID
		}
	}
	if local != nil {
		return *local
	}
	return Grant{Kind: GrantAllowAll, PolicyID: open, Degraded: true, Reason: why + " and the policy fails open"}
}
