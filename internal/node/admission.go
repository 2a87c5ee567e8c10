package node

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/server"
)

// DefaultMaxInFlight is the default bound on checks a node decides at
// once (Config.MaxInFlight, --max-inflight).
const DefaultMaxInFlight = 2048

// admission bounds the checks the node decides at once, on every face
// (gRPC, batch items, Envoy, HTTP). Past capacity in an open loop,
// arrivals outpace answers and checks pile up in the node, each waiting
// longer; beyond the bound a check is shed at once — answered UNAVAILABLE
// (HTTP 503) "node overloaded", counted as outcome "shed" — so callers
// learn of the overload in microseconds and can retry elsewhere, and the
// checks admitted keep a bounded wait. A closed loop never offers more
// than its concurrency, so below the bound nothing is shed.
type admission struct {
	next server.Checker
	max  int64
	n    atomic.Int64
}

// CheckAppend admits r (or sheds it) and passes it on with buf, so that
// a check passing through the bound keeps the decider's
// allocation-free path (server.Checker).
func (a *admission) CheckAppend(ctx context.Context, r *decide.Request, buf []decide.Status) (decide.Decision, error) {
	if !a.enter() {
		return decide.Decision{}, shedError{a.max}
	}
	defer a.leave()
	return a.next.CheckAppend(ctx, r, buf)
}

// enter takes an in-flight slot, or reports that none is free; leave
// gives it back (after an enter that succeeded).
func (a *admission) enter() bool {
	if a.max <= 0 {
		return true
	}
	if a.n.Add(1) > a.max {
		a.n.Add(-1)
		return false
	}
	return true
}

func (a *admission) leave() {
	if a.max > 0 {
		a.n.Add(-1)
	}
}

// Undo passes a batch's give-back on to the decider (server.Undoer), so
// a batch that fails midway, shed included, counts nothing.
func (a *admission) Undo(ctx context.Context, r *decide.Request, d decide.Decision) {
	if u, ok := a.next.(server.Undoer); ok {
		u.Undo(ctx, r, d)
	}
}

// shedError is the error of a check the node shed (decide.IsOverloaded).
type shedError struct{ max int64 }

func (e shedError) Error() string {
	return fmt.Sprintf("node overloaded: %d checks already in flight (--max-inflight)", e.max)
}

// Overloaded marks the error for decide.IsOverloaded.
func (shedError) Overloaded() bool { return true }
