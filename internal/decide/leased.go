package decide

import (
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
)

// leaseView makes the lease limits of set's leased policies (nil without
// a lease manager). A limit's knobs are its policy's lease block, then
// the set's (the settings document's `lease:` block), then the manager's
// defaults (filled in by NewLimit).
func (d *Decider) leaseView(set *policy.Set) map[*policy.Compiled][]*lease.Limit {
	if d.leases == nil || set == nil {
		return nil
	}
	v := map[*policy.Compiled][]*lease.Limit{}
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
		v[pol] = lims
	})
	return v
}

func leaseConfig(k policy.LeaseKnobs) lease.Config {
	return lease.Config{
		TargetPeriod: time.Duration(k.TargetPeriod), TTL: time.Duration(k.TTL),
		LowWatermark: k.LowWatermark, MaxShare: k.MaxShare, ColdHits: k.ColdHits,
	}
}

// leasedTake is one limit's take on the leased path.
type leasedTake struct {
	pol *policy.Compiled
	lim *policy.CompiledLimit
	res lease.Result
}

// takeLeased takes the check's cost from every limit of the leased
// policies pols, spending tokens on hand first, into c.takes. It reports
// whether an enforced limit denied (then every enforced take is given
// back). A policy whose take failed because a refill could not reach the
// store is added to c.failed, with the error as c.cause: it is decided by
// its on_store_failure, and its own takes are given back. A policy with
// a cold key (the lease manager answers Result.Exact: leasing it would
// cost more than it saves) gives its takes back and is added to the exact
// plan (where a store failure leaves it to its on_store_failure, as an
// exact policy).
func (c *check) takeLeased(pols []*policy.Compiled) (denied bool) {
	var buf [256]byte
	leases := c.d.leases
	for _, pol := range pols {
		lims := c.st.leased[pol]
		subject := pol.AppendSubject(buf[:0], c.r, c.tier)
		start := c.takes.len()
		for i, ll := range lims {
			// The result is written in place (TakeTo): returning it by
			// value was a third of the leased decision's time.
			t := c.takes.push(leasedTake{pol: pol, lim: &pol.Limits[i]})
			terr := leases.TakeTo(c.sctx, ll, subject, c.cost, &t.res)
			if terr != nil || t.res.Exact {
				c.takes.truncate(c.takes.len() - 1) // took nothing
				c.d.giveBack(c.takes.all()[start:])
				c.takes.truncate(start)
				if terr != nil {
					c.failed, c.cause = append(c.failed, pol), terr
				} else {
					c.plan.add(string(subject), pol, c.cost) // the bytes Subject would build again
				}
				break
			}
			if !t.res.Allowed && !pol.Shadow {
				denied = true
			}
		}
	}
	if denied {
		c.giveBack()
	}
	return denied
}

// giveBack returns the check's enforced leased takes to their leases.
func (c *check) giveBack() { c.d.giveBack(c.takes.all()) }

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

// takeList holds a check's leased takes: the first eight in the list
// itself, more on the heap. It is a small vector rather than a slice of a
// stack array because a check's fields share one fate in escape analysis:
// a slice field pointing at a stack array would move the array to the
// heap along with the ctx and errors the check passes on (one allocation
// on every leased decision).
type takeList struct {
	buf   [8]leasedTake
	n     int          // takes in buf, while spill is nil
	spill []leasedTake // all the takes, once more than buf holds
}

// push appends t and returns where it lies, for TakeTo to fill in.
func (l *takeList) push(t leasedTake) *leasedTake {
	if l.spill == nil {
		if l.n < len(l.buf) {
			l.buf[l.n] = t
			l.n++
			return &l.buf[l.n-1]
		}
		l.spill = make([]leasedTake, l.n, 2*len(l.buf))
		copy(l.spill, l.buf[:l.n])
	}
	l.spill = append(l.spill, t)
	return &l.spill[len(l.spill)-1]
}

// len is the number of takes.
func (l *takeList) len() int {
	if l.spill != nil {
		return len(l.spill)
	}
	return l.n
}

// truncate keeps the first n takes.
func (l *takeList) truncate(n int) {
	if l.spill != nil {
		l.spill = l.spill[:n]
		return
	}
	l.n = n
}

// all is the takes.
func (l *takeList) all() []leasedTake {
	if l.spill != nil {
		return l.spill
	}
	return l.buf[:l.n]
}
