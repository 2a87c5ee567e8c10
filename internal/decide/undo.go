package decide

import (
	"context"
	"slices"

	"github.com/allot-dev/allot/policy"
)

// Undo gives back what an allowed decision of r took from the region
// store, for a caller that decided r but could not deliver the answer (a
// batch whose deadline passed midway). It re-derives the groups from the
// set in force (counter keys do not change with a reload) and refunds the
// exact policies' groups, leaving out shadow groups that would have
// denied (they took nothing). It leaves alone a throttled decision (Check
// refunded it already), a degraded one (it did not take from the store)
// and leased policies (their tokens are node-local estimates; they are
// not given back). A failed refund is logged: it under-admits, never
// over-admits.
func (d *Decider) Undo(ctx context.Context, r *policy.Request, dec Decision) {
	if dec.Outcome != Allowed || dec.Degraded {
		return
	}
	st := d.state.Load()
	set := st.set
	tier := set.Tier(r)
	cost := set.Cost(r)
	var buf [8]*policy.Compiled
	p := plan{regions: d.regions}
	for _, pol := range set.Match(r, tier, buf[:0]) {
		if st.leased[pol] != nil {
			continue
		}
		if pol.Shadow && slices.ContainsFunc(dec.Shadow, func(st Status) bool { return st.PolicyID == pol.ID }) {
			continue
		}
		p.add(pol.Subject(r, tier), pol, cost)
	}
	if len(p.groups) == 0 {
		return
	}
	if err := d.store.Refund(ctx, p.store()); err != nil {
		d.log.Warn("undo refund failed", "groups", len(p.groups), "err", err)
	}
}
