package decide

import (
	"context"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
)

// UseLeases routes `precision: leased` policies through m: they are
// decided from tokens leased to this node instead of one Redis call per
// check. Without it (standalone mode) leased policies take the exact path
// on the store. Call it before serving.
func (d *Decider) UseLeases(m *lease.Manager) {
	d.leases = m
	d.view.Store(nil)
}

// leaseView maps the leased policies of one policy set to their lease
// limits, built once per set so a check looks nothing up but a map entry.
type leaseView struct {
	set    *policy.Set
	limits map[*policy.Compiled][]*lease.Limit
}

// leasedLimits returns the lease limits of pol under set, or nil when pol
// takes the exact path.
func (d *Decider) leasedLimits(set *policy.Set, pol *policy.Compiled) []*lease.Limit {
	if d.leases == nil || !pol.Leased {
		return nil
	}
	v := d.view.Load()
	if v == nil || v.set != set {
		v = d.buildView(set)
		d.view.Store(v)
	}
	return v.limits[pol]
}

// buildView makes the lease limits of set. A limit's knobs are its
// policy's lease block, then the set's (the settings document's `lease:`
// block), then the manager's defaults (the node's flags, filled in by
// NewLimit). Because the view is rebuilt for every new set, a settings
// change reaches each key at its next grant, without a restart; tokens
// already granted keep the TTL they were granted with.
func (d *Decider) buildView(set *policy.Set) *leaseView {
	v := &leaseView{set: set, limits: map[*policy.Compiled][]*lease.Limit{}}
	defaults := leaseConfig(set.LeaseDefaults())
	set.Each(func(pol *policy.Compiled) {
		if !pol.Leased {
			return
		}
		cfg := leaseConfig(pol.Lease).Or(defaults)
		lims := make([]*lease.Limit, 0, len(pol.Limits))
		for i := range pol.Limits {
			l := &pol.Limits[i]
			ll, err := d.leases.NewLimit(l.Key, regionalSpec(pol, l, d.regions), cfg, pol.Global)
			if err != nil {
				// Not leasable (another algorithm, knobs that clash with the
				// node's defaults): exact is always correct, only slower.
				d.log.Warn("leased policy takes the exact path", "policy", pol.ID, "limit", l.Name, "err", err)
				return
			}
			lims = append(lims, ll)
		}
		v.limits[pol] = lims
	})
	return v
}

func leaseConfig(k policy.LeaseKnobs) lease.Config {
	return lease.Config{
		TargetPeriod: time.Duration(k.TargetPeriod), TTL: time.Duration(k.TTL),
		LowWatermark: k.LowWatermark, MaxShare: k.MaxShare,
	}
}

// leasedTake is one limit's take on the leased path.
type leasedTake struct {
	pol *policy.Compiled
	lim *policy.CompiledLimit
	res lease.Result
}

// takeLeased takes cost from every limit of the leased policies, spending
// tokens on hand first. It returns the takes, whether an enforced limit
// denied (then every enforced take is given back), and the policies whose
// take failed because a refill could not reach the store, with the last
// such error: those are decided by their on_store_failure, and the
// policy's own takes are given back. A policy with a cold key (the lease
// manager answers Result.Exact: leasing it would cost more than it
// saves) gives its takes back and is added to the exact plan p.
func (d *Decider) takeLeased(ctx context.Context, set *policy.Set, pols []*policy.Compiled, r *policy.Request, tier string, cost int64, takes []leasedTake, p *plan) (_ []leasedTake, denied bool, failed []*policy.Compiled, err error) {
	var buf [256]byte
	for _, pol := range pols {
		lims := d.leasedLimits(set, pol)
		subject := pol.AppendSubject(buf[:0], r, tier)
		start := len(takes)
		for i, ll := range lims {
			// The result is written in place (TakeTo): returning it by
			// value was a third of the leased decision's time.
			takes = append(takes, leasedTake{pol: pol, lim: &pol.Limits[i]})
			res := &takes[len(takes)-1].res
			terr := d.leases.TakeTo(ctx, ll, subject, cost, res)
			if terr != nil || res.Exact {
				takes = takes[:len(takes)-1] // took nothing
				d.giveBack(takes[start:])
				takes = takes[:start]
				if terr != nil {
					failed, err = append(failed, pol), terr
				} else {
					p.add(pol.Subject(r, tier), pol, cost)
				}
				break
			}
			if !res.Allowed && !pol.Shadow {
				denied = true
			}
		}
	}
	if denied {
		d.giveBack(takes)
	}
	return takes, denied, failed, err
}

// giveBack returns the enforced takes to the lease: the request was denied,
// so it spends nothing.
func (d *Decider) giveBack(takes []leasedTake) {
	for i := range takes {
		if !takes[i].pol.Shadow {
			d.leases.GiveBack(&takes[i].res)
		}
	}
}

// leasedStatuses turns takes into statuses for plan.decide, appended to
// st (the storage CheckAppend was given).
func leasedStatuses(takes []leasedTake, st []Status) (_, shadow []Status) {
	for _, t := range takes {
		s := Status{
			PolicyID:   t.pol.ID,
			LimitName:  t.lim.Name,
			Limit:      t.res.Limit,
			Quota:      t.lim.Spec.Limit,
			Remaining:  t.res.Remaining,
			ResetAfter: t.res.ResetAfter,
			Window:     t.lim.Spec.Period,
			Violated:   !t.res.Allowed,
		}
		if s.Violated {
			s.RetryAfter = t.res.RetryAfter
			if s.RetryAfter == algorithm.Never {
				s.ResetAfter = 0
			}
		}
		if t.pol.Shadow {
			if s.Violated {
				shadow = append(shadow, s)
			}
			continue
		}
		st = append(st, s)
	}
	return st, shadow
}
