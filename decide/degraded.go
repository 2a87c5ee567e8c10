package decide

import (
	"context"
	"slices"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/policy"
)

// Fallback is the local store that decides `on_store_failure: local`
// policies while the region store is unavailable (*fallback.Store): the
// same takes as Store, on this node's share of each limit.
type Fallback interface {
	Store
	// Share is the capacity this node enforces of a limit of capacity c.
	Share(c int64) int64
}

// UseFallback makes `on_store_failure: local` policies decide from f while
// the store fails. Without it they fail open. Call it before serving.
func (d *Decider) UseFallback(f Fallback) { d.fallback = f }

// SetStoreTimeout bounds the store work of one check, the take and any
// refund together, by t (0: no bound beyond the store's own). Nodes leave
// it at 0: the region store judges its shards' stalls itself, and a
// check whose caller-side bound passes while the store is healthy is
// shed (an overloaded error), not decided by on_store_failure. Call it
// before serving.
func (d *Decider) SetStoreTimeout(t time.Duration) { d.timeout = t }

// storeCtx bounds ctx by the store timeout. The caller's ctx is kept for
// telling its own cancellation from the store's deadline.
func (d *Decider) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if d.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d.timeout)
}

// storeCtxFrom is storeCtx with the timeout counted from start (zero:
// from now), so that work done since start spends the same budget.
func (d *Decider) storeCtxFrom(ctx context.Context, start time.Time) (context.Context, context.CancelFunc) {
	if d.timeout <= 0 || start.IsZero() {
		return d.storeCtx(ctx)
	}
	return context.WithDeadline(ctx, start.Add(d.timeout))
}

// warnEvery rate-limits the store-failure warning: during an outage every
// check fails, and a log line per check would cost more than the check.
const warnEvery = 10 * time.Second

// degraded decides a check some of whose policies could not reach the
// store (failed; cause says why). Each enforced failed policy follows its
// on_store_failure: any `closed` one throttles the request; `local` ones
// are taken from the fallback; `open` ones are skipped, and the request,
// if allowed, is FAILED_OPEN. What did reach the store (results of p,
// leased takes) still counts, and is given back if the request is denied.
func (d *Decider) degraded(ctx, storeCtx context.Context, r *policy.Request, tier string, cost int64, p *plan, results []algorithm.Result, takes []leasedTake, failed []*policy.Compiled, cause error) (Decision, error) {
	dec, err := d.byStoreFailure(ctx, storeCtx, r, tier, cost, p, results, takes, failed, cause)
	// A shadow policy's failure changes nothing enforced.
	dec.Degraded = err == nil && slices.ContainsFunc(failed, func(pol *policy.Compiled) bool { return !pol.Shadow })
	return dec, err
}

// byStoreFailure is degraded without the Degraded mark.
func (d *Decider) byStoreFailure(ctx, storeCtx context.Context, r *policy.Request, tier string, cost int64, p *plan, results []algorithm.Result, takes []leasedTake, failed []*policy.Compiled, cause error) (Decision, error) {
	undo := func() {
		d.refundTo(storeCtx, d.store, p, results)
		d.giveBack(takes)
	}
	if err := ctx.Err(); err != nil {
		undo()
		return Decision{}, err
	}
	if now := time.Now().UnixNano(); now-d.warned.Load() >= int64(warnEvery) {
		d.warned.Store(now)
		d.log.Warn("store failed; deciding by on_store_failure (logged at most every 10s)", "err", cause)
	}
	for _, pol := range failed {
		if !pol.Shadow && pol.OnStoreFailure == policy.FailClosed {
			undo()
			return Decision{
				Outcome:  Throttled,
				PolicyID: pol.ID,
				Reason:   "policy " + pol.ID + ": " + ErrStoreUnavailable.Error() + " and the policy fails closed",
			}, nil
		}
	}
	open := ""
	local := plan{regions: d.regions}
	var localIDs []string
	for _, pol := range failed {
		switch {
		case pol.Shadow: // never denies; nothing to report without a store
		case pol.OnStoreFailure == policy.FailLocal && d.fallback != nil:
			local.add(pol.Subject(r, tier), pol, cost)
			localIDs = append(localIDs, pol.ID)
		case open == "":
			open = pol.ID
		}
	}
	var fb []algorithm.Result
	if len(local.groups) > 0 {
		var err error
		fb, err = d.fallback.Take(ctx, local.groups)
		if err != nil || len(fb) != len(local.groups) {
			// Only a spec the fallback cannot scale gets here (logged):
			// those policies fail open rather than deny forever.
			d.log.Warn("local fallback failed; failing open", "err", err)
			local, fb, localIDs = plan{regions: d.regions}, nil, nil
			if open == "" {
				open = failedOpenID(failed)
			}
		}
	}
	all := plan{
		groups: slices.Concat(p.groups, local.groups),
		refs:   slices.Concat(p.refs, local.refs),
		shadow: slices.Concat(p.shadow, local.shadow),
		out:    p.out,
	}
	dec := all.decide(slices.Concat(results, fb), cost, takes)
	d.markLocal(&dec, localIDs)
	if dec.Outcome == Throttled {
		undo()
		d.refundTo(ctx, d.fallback, &local, fb)
		return dec, nil
	}
	if open != "" {
		dec.Outcome = FailedOpen
		dec.Reason = ErrStoreUnavailable.Error()
		// The policy that failed open decided the answer (metrics count
		// FAILED_OPEN under it).
		dec.PolicyID = open
	}
	return dec, nil
}

// failedOpenID is the first enforced policy of failed: the one named by a
// FAILED_OPEN answer whose local fallback failed.
func failedOpenID(failed []*policy.Compiled) string {
	for _, pol := range failed {
		if !pol.Shadow {
			return pol.ID
		}
	}
	return ""
}

// markLocal makes the statuses of fallback-decided policies honest: not
// exact, and the limit is this node's share.
func (d *Decider) markLocal(dec *Decision, ids []string) {
	if len(ids) == 0 {
		return
	}
	for _, sts := range [][]Status{dec.Statuses, dec.Shadow} {
		for i := range sts {
			if slices.Contains(ids, sts[i].PolicyID) {
				sts[i].Exact = false
				sts[i].Limit = d.fallback.Share(sts[i].Limit)
			}
		}
	}
	if slices.Contains(ids, dec.PolicyID) {
		dec.Limit = d.fallback.Share(dec.Limit)
		if dec.Outcome == Throttled {
			dec.Reason += "; " + ErrStoreUnavailable.Error() + ", decided by this node's local share (limit / N)"
		}
	}
}
