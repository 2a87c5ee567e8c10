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
	notFresh(s) // only the CPU waiting may stretch the threshold

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
	f := newPSIFile()
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

// For freshFor after its first call a shard's stall threshold is at
// least twice Options.Timeout (within StallMax); then it is the floor
// again.
func TestFreshShardThreshold(t *testing.T) {
	sh := &shard{s: &Store{opts: Options{Timeout: 4 * time.Millisecond, StallMax: 200 * time.Millisecond, Pipelines: 2}}}
	assert.Equal(t, 4*time.Millisecond, sh.threshold(t0), "never used")
	sh.firstUse = t0
	assert.Equal(t, 8*time.Millisecond, sh.threshold(t0.Add(time.Millisecond)), "fresh")
	assert.Equal(t, 4*time.Millisecond, sh.threshold(t0.Add(freshFor)), "no longer fresh")
	sh.s.opts.StallMax = 6 * time.Millisecond
	assert.Equal(t, 6*time.Millisecond, sh.threshold(t0.Add(time.Millisecond)), "capped by StallMax")
}

// A store's first call, on a shard silent for a little longer than the
// floor (a node's start on a busy machine), is answered, not failed as a
// stall. Before freshFor it was judged at the floor.
func TestFreshShardSilenceIsNotAStall(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	const th = 20 * time.Millisecond
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: th, StallMax: 10 * th})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	s.cpu.read = func() (psi, bool) { return psi{}, true } // no CPU waiting: only freshness may stretch

	g := []algorithm.Group{{{Key: "rl:{fresh}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour}, Cost: 1}}}
	resumed := pauseFor(in, th+th/4) // the fault: silent past the floor, short of twice it
	_, err = s.Take(context.Background(), g)
	resumed()
	require.NoError(t, err, "a fresh shard's first call was judged stalled at the floor")
	assert.Equal(t, int64(0), s.Stats().Stalls)
}

// A fresh shard silent for longer than its doubled floor, while the
// store has no CPU evidence either way (here no PSI at all; on a node,
// the first psiReadEvery of its load), is judged as on a contended
// machine: after twice the threshold. A pause short of that costs
// nothing; a Redis frozen for good is still caught. Before this rule, the
// first pause was a stall at the fresh floor.
func TestFreshShardWithoutCPUEvidence(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	const th = 20 * time.Millisecond // fresh floor 40 ms, judged at 80 ms
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: th, StallMax: 10 * th})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	s.cpu.read = func() (psi, bool) { return psi{}, false } // no PSI: no evidence

	g := []algorithm.Group{{{Key: "rl:{blind}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour}, Cost: 1}}}
	resumed := pauseFor(in, 2*th+th/2) // past the fresh floor, short of twice it
	_, err = s.Take(context.Background(), g)
	resumed()
	require.NoError(t, err, "a fresh shard without CPU evidence was judged stalled at the fresh floor")
	assert.Equal(t, int64(0), s.Stats().Stalls)

	resumed = pauseFor(in, 20*th) // frozen far past any threshold
	_, err = s.Take(context.Background(), g)
	resumed()
	require.ErrorIs(t, err, ErrStalled)
	assert.Equal(t, int64(1), s.Stats().Stalls)
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

// A lone call after an idle spell (a shard that only refills a hot key's
// lease, once every 0.75 s) has no span of the PSI file over the last
// moments to be judged on: this spell's first sample is too recent. On a
// machine busy by PSI's 10 s average it is judged as on a contended one,
// after twice the threshold, so a pause of a Redis waiting for a CPU
// costs nothing; a frozen Redis is still caught. Before, the silence was
// a stall at the threshold (seen in the sweep: the breaker opened on a
// healthy Redis, docs/benchmarks.md).
func TestLoneCallOnABusyMachineIsJudgedAsContended(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	// Under psiReadEvery, as the 4 ms default is: no second sample
	// within one threshold.
	const th = 10 * time.Millisecond
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: th, StallMax: th})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	// Busy on average; no waiting in the last moments (a constant total).
	s.cpu.read = func() (psi, bool) { return psi{avg10: 2 * busyCPUPressure, total: time.Second}, true }

	g := []algorithm.Group{{{Key: "rl:{lone}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour}, Cost: 1}}}
	_, err = s.Take(context.Background(), g)
	require.NoError(t, err)
	notFresh(s)

	idleSpell(s)
	resumed := pauseFor(in, th+th*2/5) // silent past the threshold, short of twice it
	_, err = s.Take(context.Background(), g)
	resumed()
	require.NoError(t, err, "a lone call on a busy machine was judged stalled at the threshold")
	assert.Equal(t, int64(0), s.Stats().Stalls)
	assert.Equal(t, BreakerClosed, s.Shards()[0].State)

	idleSpell(s)
	resumed = pauseFor(in, 20*th) // frozen
	_, err = s.Take(context.Background(), g)
	resumed()
	require.ErrorIs(t, err, ErrStalled)
	assert.Contains(t, err.Error(), "10 s average is 20.0%", "the evidence names the average")
}

// The machine's 10 s average decides only at busyCPUPressure or more,
// and is false where PSI is not available.
func TestCPUPressureBusy(t *testing.T) {
	for _, c := range []struct {
		avg10 float64
		ok    bool
		want  bool
	}{{0, true, false}, {busyCPUPressure - 0.01, true, false}, {busyCPUPressure, true, true}, {90, true, true}, {90, false, false}} {
		p := &cpuPressure{read: func() (psi, bool) { return psi{avg10: c.avg10}, c.ok }}
		got := p.busy(t0)
		assert.Equal(t, c.want, got, "avg10 %v, available %v", c.avg10, c.ok)
	}
	// A reading that stops being available does not leave the last one.
	avail := true
	p := &cpuPressure{read: func() (psi, bool) { return psi{avg10: 90}, avail }}
	got := p.busy(t0)
	require.True(t, got)
	avail = false
	got = p.busy(t0.Add(psiReadEvery))
	assert.False(t, got, "a failed read after a busy one")
}

// idleSpell forgets the store's CPU samples, as a spell without calls
// longer than they describe would.
func idleSpell(s *Store) {
	s.cpu.mu.Lock()
	defer s.cpu.mu.Unlock()
	s.cpu.samples, s.cpu.next, s.cpu.readAt = [psiSamples]psiSample{}, 0, time.Time{}
}

// notFresh ends the fresh period (freshFor) of every shard of s.
func notFresh(s *Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sh := range s.shards {
		sh.mu.Lock()
		sh.firstUse = time.Now().Add(-freshFor)
		sh.mu.Unlock()
	}
}

// A Redis silent past twice the threshold while the hypervisor has been
// taking this machine's CPUs (/proc/stat's steal; PSI sees no waiting) is
// judged only after stealGrace: a vCPU paused that way is silent for the
// pause. Before, the silence was a stall at twice the threshold at most
// (the control below, the same pause on a machine without steal), and
// every call in flight failed open. A Redis frozen for good is still
// caught, after stealGrace.
func TestSilenceWhileTheHypervisorStealsIsNotAStall(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	const th = 8 * time.Millisecond // the floor; an idle shard's threshold
	pause := 2*th + 12*time.Millisecond
	require.Less(t, pause, stealGrace-10*time.Millisecond)
	g := []algorithm.Group{{{Key: "rl:{steal}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour}, Cost: 1}}}
	open := func(share float64) *Store {
		s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: th, StallMax: th})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		s.cpu.read = func() (psi, bool) { return psi{}, true } // no task waits for a CPU
		base := time.Now()
		s.cpu.stat = func() (cpuTimes, bool) { // the machine's time, share of it stolen
			all := int64(time.Since(base))
			return cpuTimes{steal: int64(share * float64(all)), all: all}, true
		}
		_, err = s.Take(context.Background(), g)
		require.NoError(t, err)
		notFresh(s)
		return s
	}
	// The last moments as the shards' checks sample them under load.
	recent := func(s *Store) {
		s.cpu.mu.Lock()
		s.cpu.stolen, s.cpu.readAt = [psiSamples]stealSample{}, time.Time{} // samples of real time would come after
		s.cpu.mu.Unlock()
		now := time.Now()
		for d := 4 * stealMinSpan; d > 0; d -= psiReadEvery {
			s.cpu.sample(now.Add(-d))
		}
	}

	stolen := open(0.2)
	recent(stolen)
	resumed := pauseFor(in, pause)
	_, err := stolen.Take(context.Background(), g)
	resumed()
	require.NoError(t, err, "a shard silent while the hypervisor steals CPUs was judged stalled")
	assert.Equal(t, int64(0), stolen.Stats().Stalls)
	assert.Equal(t, BreakerClosed, stolen.Shards()[0].State)

	plain := open(0)
	recent(plain)
	resumed = pauseFor(in, pause)
	_, err = plain.Take(context.Background(), g)
	resumed()
	require.ErrorIs(t, err, ErrStalled, "control: without steal the same pause is a stall")
	assert.NotContains(t, err.Error(), "hypervisor took 2", "no steal reported")

	recent(stolen)
	resumed = pauseFor(in, 3*stealGrace) // frozen past the grace
	start := time.Now()
	_, err = stolen.Take(context.Background(), g)
	waited := time.Since(start)
	resumed()
	require.ErrorIs(t, err, ErrStalled, "a Redis frozen while the hypervisor steals is still caught")
	assert.Contains(t, err.Error(), "the hypervisor took 20.0% of the CPUs", "the log says why the judgement waited")
	assert.GreaterOrEqual(t, waited, stealGrace, "judged no earlier than the grace")
	assert.Equal(t, int64(1), stolen.Stats().Stalls)
}

// The store reads this machine's /proc/stat when it has one: steal and
// all only grow, and nothing is read once the file is closed.
func TestStatFileReads(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skip("no /proc/stat here")
	}
	f := newStatFile()
	a, ok := f.read()
	require.True(t, ok)
	b, ok := f.read()
	require.True(t, ok)
	assert.Positive(t, a.all)
	assert.GreaterOrEqual(t, b.all, a.all, "cumulative")
	assert.GreaterOrEqual(t, b.steal, a.steal, "cumulative")
	f.close()
	_, ok = f.read()
	assert.False(t, ok, "read after close")
}

// Without a breaker, the calls queued behind a stalled pipeline fail at
// the same judgement, as the calls in it do: one stall, not one more per
// pipeline sent after it (with one pipeline in flight, each queued call
// would otherwise wait a threshold of its own).
func TestQueuedCallsFailWithAStallWithoutABreaker(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	const th = 20 * time.Millisecond
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: th, StallMax: th, Pipelines: 1, Breaker: BreakerOptions{Disabled: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	s.cpu.read = func() (psi, bool) { return psi{}, false } // no PSI: no starvation
	g := []algorithm.Group{{{Key: "rl:{queued}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour}, Cost: 1}}}
	_, err = s.Take(context.Background(), g)
	require.NoError(t, err)
	notFresh(s)
	require.Len(t, s.shards, 1)
	var sh *shard
	for _, x := range s.shards {
		sh = x
	}

	in.Pause()
	t.Cleanup(in.Continue)
	errs := make(chan error, 2)
	take := func() { _, err := s.Take(context.Background(), g); errs <- err }
	go take() // owned: reports on errs
	require.Eventually(t, func() bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return len(sh.inflight) == 1 && !sh.inflight[0].sent.IsZero()
	}, time.Second, 100*time.Microsecond, "the first call is sent")
	go take() // owned: reports on errs
	require.Eventually(t, func() bool {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return len(sh.queue) == 1
	}, time.Second, 100*time.Microsecond, "the second call queues behind it")
	for range 2 {
		require.ErrorIs(t, <-errs, ErrStalled)
	}
	assert.Equal(t, int64(1), s.Stats().Stalls, "one stall failed both")
}
