package decide

import (
	"slices"

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

// degraded decides a check some of whose policies could not reach the
// store (c.failed; c.cause says why). Each enforced failed policy follows its
// on_store_failure: any `closed` one throttles the request; `local` ones
// are taken from the fallback; `open` ones are skipped, and the request,
// if allowed, is FAILED_OPEN. What did reach the store (c.plan's answered groups, the
// leased takes) still counts, and is given back if the request is denied.
func (c *check) degraded() (Decision, error) {
	dec, err := c.byStoreFailure()
	// A shadow policy's failure changes nothing enforced.
	dec.Degraded = err == nil && slices.ContainsFunc(c.failed, func(pol *policy.Compiled) bool { return !pol.Shadow })
	return dec, err
}

// byStoreFailure is degraded without the Degraded mark.
func (c *check) byStoreFailure() (Decision, error) {
	d := c.d
	if err := c.ctx.Err(); err != nil {
		c.undo()
		return Decision{}, err
	}
	// A line per check during an outage: Config.Log is rate-limited.
	d.log.Warn("store failed; deciding by on_store_failure", "err", c.cause)
	var lbuf [8]*policy.Compiled
	f := d.onFailure(c.failed, lbuf[:0])
	if pol := f.closed; pol != nil {
		c.undo()
		return Decision{
			Outcome:  Throttled,
			PolicyID: pol.ID,
			Reason:   "policy " + pol.ID + ": " + ErrStoreUnavailable.Error() + " and the policy fails closed",
		}, nil
	}
	open := f.open
	local := plan{regions: d.regions}
	var localIDs []string
	for _, pol := range f.local {
		local.add(pol.Subject(c.r, c.tier), pol, c.cost)
		localIDs = append(localIDs, pol.ID)
	}
	if len(local.groups) > 0 {
		fb, err := d.fallback.Take(c.ctx, local.store())
		if err == nil && len(fb) == len(local.groups) {
			local.answer(fb)
		} else {
			// Only a spec the fallback cannot scale gets here (logged):
			// those policies fail open rather than deny forever.
			d.log.Warn("local fallback failed; failing open", "err", err)
			local, localIDs = plan{regions: d.regions}, nil
			if open == "" {
				open = failedOpenID(c.failed)
			}
		}
	}
	all := plan{groups: slices.Concat(c.plan.groups, local.groups), out: c.plan.out}
	dec := all.decide(c.cost, c.takes.all())
	d.markLocal(&dec, localIDs)
	if dec.Outcome == Throttled {
		c.undo()
		c.refundTo(c.ctx, d.fallback, &local)
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

// failure is what on_store_failure makes of a store failure for a set
// of policies (onFailure).
type failure struct {
	// closed is the first enforced policy that fails closed: the answer
	// is a denial, and local and open are left empty.
	closed *policy.Compiled
	// local are the enforced policies this node's fallback decides
	// (`local`, with a fallback), in their order.
	local []*policy.Compiled
	// open names the first enforced policy that fails open (`open`, or
	// `local` with no fallback); "" if none.
	open string
}

// onFailure sorts the enforced policies of failed (shadow ones never
// deny, and are skipped) by their on_store_failure, in its order of
// precedence: any `closed` one decides a denial; otherwise `local` ones
// are decided by the fallback and the rest fail open. The local policies
// are appended to buf. Checks (degraded) and quota clients (QuotaFailed)
// both decide by it.
func (d *Decider) onFailure(failed, buf []*policy.Compiled) failure {
	f := failure{local: buf}
	for _, pol := range failed {
		if !pol.Shadow && pol.OnStoreFailure == policy.FailClosed {
			return failure{closed: pol}
		}
	}
	for _, pol := range failed {
		switch {
		case pol.Shadow: // never denies; nothing to report without a store
		case pol.OnStoreFailure == policy.FailLocal && d.fallback != nil:
			f.local = append(f.local, pol)
		case f.open == "":
			f.open = pol.ID
		}
	}
	return f
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
