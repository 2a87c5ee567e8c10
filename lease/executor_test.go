package lease

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExecutorRunsRefills shows Options.Executor replaces the workers: a
// refill is sent only when the executor runs it, a Take with no tokens
// and an expired ctx returns at once (nothing else can end its wait), and
// after the run the key decides from memory. This is what lets
// internal/tools/sim drive the real manager on virtual time.
func TestExecutorRunsRefills(t *testing.T) {
	c := NewManualClock()
	f := newFake(c)
	var queued []func()
	m, err := New(Options{Source: f, Clock: c, SweepEvery: -1, Executor: func(run func()) { queued = append(queued, run) }})
	require.NoError(t, err)
	lim := newLimit(t, m, spec(100, time.Second, 100), Config{}, false)

	expired, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	_, err = m.Take(expired, lim, []byte("a"), 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Len(t, queued, 1, "the refill is queued, not sent")
	assert.Equal(t, 0, f.calls)

	queued[0]()
	queued = queued[1:]
	assert.Equal(t, 1, f.calls)
	r, err := m.Take(expired, lim, []byte("a"), 1)
	require.NoError(t, err)
	assert.True(t, r.Allowed)

	// Runs queued before Abort do nothing after it.
	_, _ = m.Take(expired, lim, []byte("b"), 1)
	require.NotEmpty(t, queued)
	m.Abort()
	for _, run := range queued {
		run()
	}
	assert.Equal(t, 1, f.calls)
}

// TestFixedHashIsStable: with FixedHash two managers place a subject
// identically (the same hash), so a simulation's refill batching does not
// depend on a random seed.
func TestFixedHashIsStable(t *testing.T) {
	a, err := New(Options{Source: newFake(NewManualClock()), SweepEvery: -1, FixedHash: true})
	require.NoError(t, err)
	defer a.Abort()
	b, err := New(Options{Source: newFake(NewManualClock()), SweepEvery: -1, FixedHash: true})
	require.NoError(t, err)
	defer b.Abort()
	for _, s := range []string{"", "a", "user:42", "rl:{x}:p:l"} {
		assert.Equal(t, a.hash([]byte(s)), b.hash([]byte(s)), s)
	}
	assert.NotEqual(t, a.hash([]byte("a")), a.hash([]byte("b")))
	// The stripe comes from the top bits: 256 subjects must not all share one.
	stripes := map[uint64]bool{}
	for i := range 256 {
		stripes[a.hash([]byte{byte(i)})>>(64-stripeBits)] = true
	}
	assert.Greater(t, len(stripes), 100)
}
