package node

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/decide"
)

// blockingChecker holds every check until release is closed.
type blockingChecker struct {
	entered chan struct{}
	release chan struct{}
}

func (b *blockingChecker) CheckAppend(context.Context, *decide.Request, []decide.Status) (decide.Decision, error) {
	b.entered <- struct{}{}
	<-b.release
	return decide.Decision{Outcome: decide.Allowed}, nil
}

// Checks beyond the bound are shed at once with an overloaded error;
// once one in flight finishes, the next is admitted.
func TestAdmissionShedsBeyondTheBound(t *testing.T) {
	b := &blockingChecker{entered: make(chan struct{}, 2), release: make(chan struct{})}
	a := &admission{next: b, max: 2}
	done := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := a.CheckAppend(context.Background(), &decide.Request{}, nil)
			done <- err
		}()
		<-b.entered
	}
	_, err := a.CheckAppend(context.Background(), &decide.Request{}, nil)
	require.Error(t, err)
	assert.True(t, decide.IsOverloaded(err), "shed: %v", err)
	close(b.release)
	for range 2 {
		require.NoError(t, <-done)
	}
	go func() { <-b.entered }()
	dec, err := a.CheckAppend(context.Background(), &decide.Request{}, nil)
	require.NoError(t, err)
	assert.Equal(t, decide.Allowed, dec.Outcome)
	assert.Equal(t, int64(0), a.n.Load())
}
