package region

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/redistest"
)

// A Redis that stops answering for a moment while this machine's tasks
// are waiting for a CPU (PSI's total says so, though its 10 s average
// does not) is waiting for a CPU itself, not frozen: its silence is
// judged only after twice the threshold, and a pause shorter than that
// costs nothing. Before, the judgement came at the threshold and failed
// the call as stalled.
func TestSilenceWhileTheMachineWaitsForCPUIsNotAStall(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	const th = 20 * time.Millisecond // the floor; an idle shard's threshold
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: th, StallMax: th})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	start := time.Now()
	// Every moment fully contended, by the cumulative total only.
	s.cpu.read = func() (psi, bool) { return psi{avg10: 0, total: time.Since(start)}, true }

	g := []algorithm.Group{{{Key: "rl:{cpu}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour}, Cost: 1}}}
	_, err = s.Take(context.Background(), g)
	require.NoError(t, err)

	resumed := pauseFor(in, th+th/4) // the fault: silent past the threshold, short of twice it
	_, err = s.Take(context.Background(), g)
	resumed()
	require.NoError(t, err, "a shard silent while the machine waits for a CPU was judged stalled")
	assert.Equal(t, int64(0), s.Stats().Stalls)
	assert.Equal(t, BreakerClosed, s.Shards()[0].State)
}

// The store reads this machine's PSI file when it has one, and nothing
// once it closed it (a check still running as the store closes must not
// open it again).
func TestPSIFileReads(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/cpu"); err != nil {
		t.Skip("no /proc/pressure/cpu here")
	}
	var f psiFile
	a, ok := f.read()
	require.True(t, ok)
	b, ok := f.read()
	require.True(t, ok)
	assert.GreaterOrEqual(t, b.total, a.total, "a cumulative total")
	f.close()
	_, ok = f.read()
	assert.False(t, ok, "read after close")
	assert.Nil(t, f.f, "not reopened")
}

// pauseFor freezes in now and resumes it after d, from a goroutine that
// the returned function waits for.
func pauseFor(in *redistest.Instance, d time.Duration) (wait func()) {
	in.Pause()
	resumed := make(chan struct{})
	go func() { // owned: ends after resuming the server; wait joins it
		defer close(resumed)
		time.Sleep(d)
		in.Continue()
	}()
	return func() { <-resumed }
}
