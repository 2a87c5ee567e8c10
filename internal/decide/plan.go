package decide

import (
	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/bucket"
	"github.com/allot-dev/allot/policy"
)

// group is one subject's store work: the items the store takes
// all-or-nothing, and the policies they come from.
type group struct {
	// items holds, for each policy of pols in order, one item per limit
	// in the policy's order: an item's policy and limit are found by
	// walking pols alongside.
	items  algorithm.Group
	pols   []*policy.Compiled
	shadow bool // the policies are in shadow mode: a denial only reports
	// result is the store's answer to items, once answered (see
	// plan.answer); a group not answered yet counts for nothing.
	result   algorithm.Result
	answered bool
}

// plan is the store work of one check.
type plan struct {
	groups []group
	// regions is n for global policies: see Config.Regions.
	regions int
	// work is the groups' items as Store takes them, made by store.
	work []algorithm.Group
	// out is the storage decide builds the statuses in (CheckAppend).
	out []Status
	// room is storage for the first group and items, made by the first
	// add: one allocation where the slices cost five. Nil for a check
	// with no exact policy (the leased path allocates nothing here).
	room *planRoom
}

// planRoom holds a typical check's plan: one group of up to two items
// from up to two policies. More spill to the heap by append.
type planRoom struct {
	groups [1]group
	work   [1]algorithm.Group
	items  [2]algorithm.Item
	pols   [2]*policy.Compiled
	used   int  // items handed out
	polsIn bool // pols handed out (to the first group)
}

func (p *plan) add(subject string, pol *policy.Compiled, cost int64) {
	if p.room == nil && p.groups == nil {
		p.room = &planRoom{}
		p.groups = p.room.groups[:0]
	}
	gi := -1
	for i := range p.groups {
		if p.groups[i].shadow == pol.Shadow && bucket.HasSubject(p.groups[i].items[0].Key, subject) {
			gi = i
			break
		}
	}
	if gi < 0 {
		g := group{shadow: pol.Shadow}
		if r := p.room; r != nil {
			if r.used+len(pol.Limits) <= len(r.items) {
				// Capped at this policy's limits: a later policy appending
				// to the group reallocates rather than overwrite another
				// group's items.
				n := r.used + len(pol.Limits)
				g.items = r.items[r.used:r.used:n]
				r.used = n
			}
			if !r.polsIn {
				g.pols, r.polsIn = r.pols[:0], true
			}
		}
		p.groups = append(p.groups, g)
		gi = len(p.groups) - 1
	}
	g := &p.groups[gi]
	g.pols = append(g.pols, pol)
	for i := range pol.Limits {
		l := &pol.Limits[i]
		g.items = append(g.items, algorithm.Item{Key: l.Key(subject), Spec: regionalSpec(pol, l, p.regions), Cost: cost})
	}
}

// store is the plan's groups as Store takes them: work[i] is groups[i]'s
// items. Made once per plan, for the take and any refund.
func (p *plan) store() []algorithm.Group {
	if p.work == nil {
		if p.room != nil && len(p.groups) <= len(p.room.work) {
			p.work = p.room.work[:0]
		}
		for i := range p.groups {
			p.work = append(p.work, p.groups[i].items)
		}
	}
	return p.work
}

// answer gives each group its result: results[i] is the store's answer
// to groups[i] (the Store contract's order), the one place the two are
// lined up by index.
func (p *plan) answer(results []algorithm.Result) {
	for i := range p.groups {
		p.groups[i].result, p.groups[i].answered = results[i], true
	}
}

// allowed is the items of the groups the store allowed, for a refund.
func (p *plan) allowed() []algorithm.Group {
	var back []algorithm.Group
	for i := range p.groups {
		if g := &p.groups[i]; g.answered && g.result.Allowed {
			back = append(back, g.items)
		}
	}
	return back
}

// decide turns the answered groups and the leased takes into the
// decision.
func (p *plan) decide(cost int64, takes []leasedTake) Decision {
	var dec Decision
	var deciding *Status
	dec.Statuses, dec.Shadow = leasedStatuses(takes, p.out[:0])
	type take struct {
		i        int // index in dec.Statuses
		cost     int64
		windowed bool
	}
	var taken []take // items of allowed groups
	for gi := range p.groups {
		g := &p.groups[gi]
		if !g.answered {
			continue
		}
		res := &g.result
		ii := 0
		for _, pol := range g.pols {
			for li := range pol.Limits {
				it, ir := &g.items[ii], &res.Items[ii]
				ii++
				st := Status{
					PolicyID:   pol.ID,
					LimitName:  pol.Limits[li].Name,
					Limit:      it.Spec.Capacity(),
					Quota:      it.Spec.Limit,
					Remaining:  ir.Remaining,
					ResetAfter: ir.ResetAfter,
					Window:     it.Spec.Period,
					Violated:   !res.Allowed && ir.RetryAfter != 0,
					// Decided by the store itself (a cold key of a leased
					// policy too); the fallback's are marked by markLocal.
					Exact: true,
				}
				if st.Violated {
					st.RetryAfter = ir.RetryAfter
				}
				if g.shadow {
					if st.Violated {
						dec.Shadow = append(dec.Shadow, st)
					}
					continue
				}
				if res.Allowed {
					taken = append(taken, take{len(dec.Statuses), it.Cost, it.Spec.Algorithm.Windowed()})
				}
				dec.Statuses = append(dec.Statuses, st)
			}
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
		// A denied check gives back what its allowed groups took (the
		// check's refund): report those limits as they will stand, not as
		// they stood between take and refund (another subject's
		// ip-perimeter showed r=375 while Redis held 400).
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
