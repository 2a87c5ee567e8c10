package node

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/server"
)

type undoCounter struct{ undone int }

func (u *undoCounter) CheckAppend(context.Context, *decide.Request, []decide.Status) (decide.Decision, error) {
	return decide.Decision{}, nil
}

func (u *undoCounter) Undo(context.Context, *decide.Request, decide.Decision) { u.undone++ }

// The admission in front of the decider must pass a batch's give-back on:
// the batch path finds Undo by a type assertion on its checker.
func TestAdmissionPassesUndoOn(t *testing.T) {
	next := &undoCounter{}
	var c server.Checker = &admission{next: next, max: 1}
	u, ok := c.(server.Undoer)
	if !ok {
		t.Fatal("admission is not a server.Undoer")
	}
	u.Undo(context.Background(), &decide.Request{}, decide.Decision{})
	if next.undone != 1 {
		t.Fatalf("undone %d times, want 1", next.undone)
	}
}
