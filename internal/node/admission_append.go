package node

import (
	"context"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/server"
)

// CheckAppend is Check with the decision's statuses built in buf's
// storage (server.AppendChecker), so that a batch passing through the
// bound keeps the decider's allocation-free path. It is admitted and
// shed exactly as Check.
func (a *admission) CheckAppend(ctx context.Context, r *decide.Request, buf []decide.Status) (decide.Decision, error) {
	next, ok := a.next.(server.AppendChecker)
	if !ok {
		return a.Check(ctx, r)
	}
	if !a.enter() {
		return decide.Decision{}, shedError{a.max}
	}
	defer a.leave()
	return next.CheckAppend(ctx, r, buf)
}
