package decide

import (
	"context"
	"fmt"

	"github.com/allot-dev/allot/policy"
)

// check is one decision in the making: the request, the policy state it
// started on, and what the leases and the store answered. The steps of a
// decision are its methods, so that they share its state instead of
// passing it along.
type check struct {
	d  *Decider
	st *state // the set (and its lease view) the check decides on
	// ctx is the caller's: its end means the caller stopped waiting.
	ctx context.Context
	// sctx is ctx bounded by the check's budget (Config.Timeout), set
	// once, at its start: the lease waits, the take and the refunds all
	// spend it. It is ctx itself without a budget.
	sctx context.Context
	r    *policy.Request
	tier string
	cost int64

	plan   plan               // the exact policies' store work and its answers
	takes  takeList           // the leased policies' takes
	failed []*policy.Compiled // policies decided by on_store_failure
	cause  error              // why the last of failed failed
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
	st := d.state.Load()
	// Field by field, not a composite literal: that is built aside and
	// copied, a kilobyte on every check.
	var c check
	c.d, c.st, c.ctx, c.sctx, c.r = d, st, ctx, ctx, r
	c.tier, c.cost = st.set.Tier(r), st.set.Cost(r)
	var buf [8]*policy.Compiled
	matched := st.set.Match(r, c.tier, buf[:0])
	if len(matched) == 0 {
		return Decision{Outcome: Allowed}, nil
	}
	c.plan = plan{regions: d.regions, out: statuses[:0]}
	var leasedBuf, exactBuf [8]*policy.Compiled
	leased, exact := leasedBuf[:0], exactBuf[:0]
	for _, pol := range matched {
		if st.leased[pol] != nil {
			leased = append(leased, pol)
			continue
		}
		exact = append(exact, pol)
		c.plan.add(pol.Subject(r, c.tier), pol, c.cost)
	}
	if d.timeout > 0 {
		var cancel context.CancelFunc
		c.sctx, cancel = context.WithTimeout(ctx, d.timeout)
		defer cancel()
	}
	if len(leased) > 0 {
		denied := c.takeLeased(leased)
		if IsOverloaded(c.cause) {
			c.giveBack()
			return Decision{}, fmt.Errorf("leased check: %w", c.cause)
		}
		if denied || (len(c.plan.groups) == 0 && len(c.failed) == 0) {
			// A leased denial decides without asking the store at all.
			return c.plan.decide(c.cost, c.takes.all()), nil
		}
	}
	if len(c.plan.groups) > 0 {
		if err := c.take(exact); err != nil {
			c.giveBack()
			return Decision{}, err
		}
	}
	if len(c.failed) > 0 {
		return c.degraded()
	}
	dec := c.plan.decide(c.cost, c.takes.all())
	if d.counts {
		d.demand.record(&c.plan, dec.Outcome == Throttled, c.cost)
	}
	if dec.Outcome == Throttled {
		c.undo()
	}
	return dec, nil
}

// take asks the store for the plan's groups. A store failure leaves the
// plan's policies to on_store_failure (c.failed): the exact ones, then
// the leased ones whose cold key put them in the plan (takeLeased); an
// error returned sheds the check (overload, or a store that broke its
// contract).
func (c *check) take(exact []*policy.Compiled) error {
	results, err := c.d.store.Take(c.sctx, c.plan.store())
	switch {
	case IsOverloaded(err):
		return fmt.Errorf("check: %w", err)
	case err != nil:
		c.failed, c.cause = append(c.failed, exact...), err
		for _, g := range c.plan.groups {
			for _, pol := range g.pols {
				if c.st.leased[pol] != nil {
					c.failed = append(c.failed, pol)
				}
			}
		}
		c.plan = plan{regions: c.d.regions, out: c.plan.out}
	case len(results) != len(c.plan.groups):
		return fmt.Errorf("store answered %d groups for %d", len(results), len(c.plan.groups))
	default:
		c.plan.answer(results)
	}
	return nil
}

// undo gives back what a denied check took: the allowed groups' tokens to
// the store, so that a denial by one subject burns no tokens of another,
// and the leased takes to their leases.
func (c *check) undo() {
	c.refundTo(c.sctx, c.d.store, &c.plan)
	c.giveBack()
}

// refundTo gives back to store what the allowed groups of p took. The
// refund outlives ctx's cancellation but not its deadline: given c.sctx,
// it spends what the take left of the check's budget.
func (c *check) refundTo(ctx context.Context, store Store, p *plan) {
	back := p.allowed()
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
		c.d.log.Warn("refund failed", "groups", len(back), "err", err)
	}
}
