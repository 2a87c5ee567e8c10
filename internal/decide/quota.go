package decide

import (
	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/policy"
)

// A quota client (an RLQS stream, internal/rlqs) does not ask the node
// per request: it is assigned a rate for a bucket of requests, decides
// them itself, and reports what it admitted. Quota says which region
// buckets such a bucket spends, so that the client's part of each is
// split with every other consumer of it and its usage charged to it.

// GrantKind says how a quota client decides a bucket's requests until
// its next round.
type GrantKind int

// Grant kinds.
const (
	// GrantParts decides by parts of the rates of Quota.Keys: the keys of
	// leased policies, split among their consumers (internal/rlqs).
	GrantParts GrantKind = iota
	// GrantAllowAll admits every request: no enforced policy matches, the
	// requests cost nothing, or the store failed and the policies fail
	// open.
	GrantAllowAll
	// GrantDenyAll denies every request: an enforced policy is exact (a
	// client deciding locally cannot be exact), or the store failed and a
	// policy fails closed.
	GrantDenyAll
	// GrantLocal decides by this node's share of the limit (LocalBurst,
	// LocalRate) while the store fails, for `on_store_failure: local`.
	GrantLocal
)

// QuotaKey is one region bucket a quota bucket spends: a limit of a
// leased policy for the bucket's subject.
type QuotaKey struct {
	Key    string
	Spec   algorithm.Spec // the region's numbers (a global limit's default share)
	Global bool
}

// Grant is what Quota answers, and QuotaFailed when the store failed.
type Grant struct {
	Kind GrantKind
	// Keys are the region buckets of a GrantParts, and Cost the tokens
	// one request takes from each.
	Keys []QuotaKey
	Cost int64
	// LocalBurst and LocalRate (requests/s) are this node's share of the
	// tightest `local` limit, for GrantLocal.
	LocalBurst int64
	LocalRate  float64
	// PolicyID names the deciding policy (the first enforced one for
	// GrantParts), Reason says why for anything but a GrantParts.
	PolicyID string
	Reason   string
	// Degraded: decided by on_store_failure, without the store.
	Degraded bool
	// Unbatchable: a GrantDenyAll because no quota client can decide these
	// requests (an exact policy, or a node that leases nothing), not
	// because they are over a limit: a client that can check by RPC
	// should.
	Unbatchable bool

	enforced []*policy.Compiled // for QuotaFailed
}

// Quota says how a quota client decides the requests r describes: by
// parts of the region buckets of every enforced policy matching r (all
// leased), or by a blanket rule. Shadow policies are skipped (they never
// deny). An exact enforced policy answers GrantDenyAll: only leased
// policies can be decided by a client. It reads no store.
func (d *Decider) Quota(r *policy.Request) Grant {
	st := d.state.Load()
	tier, cost := st.set.Tier(r), st.set.Cost(r)
	var mbuf [8]*policy.Compiled
	var enforced []*policy.Compiled
	for _, pol := range st.set.Match(r, tier, mbuf[:0]) {
		if !pol.Shadow {
			enforced = append(enforced, pol)
		}
	}
	if len(enforced) == 0 {
		return Grant{Kind: GrantAllowAll, Reason: "no enforced policy matches"}
	}
	if cost == 0 {
		return Grant{Kind: GrantAllowAll, Reason: "the route's requests cost nothing"}
	}
	if d.leases == nil {
		return Grant{Kind: GrantDenyAll, PolicyID: enforced[0].ID, Unbatchable: true, Reason: "this node leases nothing (standalone): a quota client needs leased policies"}
	}
	g := Grant{Kind: GrantParts, Cost: cost, PolicyID: enforced[0].ID, enforced: enforced}
	var subj [256]byte
	for _, pol := range enforced {
		if st.leased[pol] == nil {
			return Grant{Kind: GrantDenyAll, PolicyID: pol.ID, Unbatchable: true,
				Reason: "policy " + pol.ID + " is exact: a quota client can only enforce `precision: leased` policies; check these requests with CheckRateLimit"}
		}
		subject := string(pol.AppendSubject(subj[:0], r, tier))
		for i := range pol.Limits {
			l := &pol.Limits[i]
			g.Keys = append(g.Keys, QuotaKey{Key: l.Key(subject), Spec: regionalSpec(pol, l, d.regions), Global: pol.Global})
		}
	}
	return g
}

// QuotaFailed is the answer for g's requests while the store fails: the
// strictest on_store_failure among its enforced policies decides, by the
// precedence checks follow (onFailure).
func (d *Decider) QuotaFailed(g *Grant, cause error) Grant {
	// A line per round of every stream during an outage: Config.Log is
	// rate-limited.
	d.log.Warn("store failed; quota decided by on_store_failure", "err", cause)
	why := ErrStoreUnavailable.Error()
	var lbuf [8]*policy.Compiled
	f := d.onFailure(g.enforced, lbuf[:0])
	if pol := f.closed; pol != nil {
		return Grant{Kind: GrantDenyAll, PolicyID: pol.ID, Degraded: true, Reason: "policy " + pol.ID + ": " + why + " and the policy fails closed"}
	}
	// The tightest local share of any limit decides.
	var local *Grant
	for _, pol := range f.local {
		for i := range pol.Limits {
			s := regionalSpec(pol, &pol.Limits[i], d.regions)
			c := s.Capacity()
			share := d.fallback.Share(c)
			l := Grant{Kind: GrantLocal, PolicyID: pol.ID, Degraded: true,
				LocalBurst: share / g.Cost, LocalRate: s.Rate() * float64(share) / float64(c) / float64(g.Cost),
				Reason: why + ", decided by this node's local share (limit / N)"}
			if local == nil || l.LocalRate < local.LocalRate {
				local = &l
			}
		}
	}
	if local != nil {
		return *local
	}
	return Grant{Kind: GrantAllowAll, PolicyID: f.open, Degraded: true, Reason: why + " and the policy fails open"}
}

// QuotaUsage counts what quota clients admitted and denied of a global
// key (tokens), for the coordinator's demand (DrainDemand), as the exact
// path counts its own: only if Config.Demand says something drains it.
func (d *Decider) QuotaUsage(key string, admitted, denied int64) {
	if d.counts {
		d.demand.add(key, admitted, denied)
	}
}
