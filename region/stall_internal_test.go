package region

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/redistest"
)

var testGroup = []algorithm.Group{{{Key: "rl:{stall}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1_000_000_000, Period: time.Hour}, Cost: 1}}}

// A frozen Redis is caught by the rule: the call fails as stalled while
// the server is still frozen, and the breaker opens.
func TestFrozenRedisIsAStall(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: 4 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	_, err = s.Take(context.Background(), testGroup)
	require.NoError(t, err)

	var frozen atomic.Bool
	frozen.Store(true)
	in.Pause()
	resumed := make(chan struct{})
	go func() { // owned: resumes the server once the call returned or after 5 s
		defer close(resumed)
		select {
		case <-t.Context().Done():
		case <-time.After(5 * time.Second):
		}
		frozen.Store(false)
		in.Continue()
	}()
	_, err = s.Take(context.Background(), testGroup)
	stillFrozen := frozen.Load()
	require.ErrorIs(t, err, ErrStalled)
	assert.True(t, stillFrozen, "the stall was judged while Redis was frozen")
	assert.Equal(t, int64(1), s.Stats().Stalls)
	assert.Equal(t, BreakerOpen, s.Shards()[0].State)
}

// pauseChild is the environment variable that makes this test binary the
// child of TestOwnPauseIsNotAStall: a store under load on the Redis it
// names.
const pauseChild = "ALLOT_REGION_PAUSE_CHILD"

type pauseCounts struct {
	Calls, Errors, Stalls, Openings int64
	First                           string // the first error
}

// The node's own pauses are never Redis's fault: a process carrying load
// on a healthy Redis, stopped for 20, 100 and 250 ms (SIGSTOP/SIGCONT, as
// CFS throttling stops it), answers every call late and judges no stall.
// A rule that judged silence alone would fail here: on waking, the
// shard's check runs before the replies that arrived meanwhile are read.
func TestOwnPauseIsNotAStall(t *testing.T) {
	if addr := os.Getenv(pauseChild); addr != "" {
		runPauseChild(addr)
		return
	}
	redistest.Require(t)
	in := redistest.Server(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestOwnPauseIsNotAStall$")
	cmd.Env = append(os.Environ(), pauseChild+"="+in.Addr)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "the child starts")
	require.Equal(t, "loaded", lines.Text())

	for _, d := range []time.Duration{20 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond} {
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
		time.Sleep(d) // the fault: the child stopped for d
		require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
		time.Sleep(100 * time.Millisecond) // load between the pauses
	}
	require.NoError(t, stdin.Close()) // the child stops its load and reports
	var got pauseCounts
	require.True(t, lines.Scan(), "the child reports")
	require.NoError(t, json.Unmarshal(lines.Bytes(), &got), lines.Text())
	require.NoError(t, cmd.Wait())
	assert.Positive(t, got.Calls)
	assert.Zero(t, got.Errors, "calls failed while the process was paused; the first: %s", got.First)
	assert.Zero(t, got.Stalls, "a stall was judged on the process's own pause")
	assert.Zero(t, got.Openings)
}

// pauseT is the child's stall threshold: over the Redis tail of a shared
// test machine (silences of up to 10 ms from a healthy Redis;
// docs/performance.md, "Machine") and under the 100 and 250 ms pauses, so
// that the test checks the node's pauses, not the host's.
const pauseT = 25 * time.Millisecond

// runPauseChild keeps 8 calls in flight on addr until stdin closes, then
// prints its counts as JSON.
func runPauseChild(addr string) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)) // the stall's evidence, if one is judged
	s, err := Open(context.Background(), []string{addr}, Options{Timeout: pauseT, Logger: log})
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	var calls, errs atomic.Int64
	var first atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { // owned: stops with stop
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.Take(context.Background(), testGroup); err != nil {
					errs.Add(1)
					first.CompareAndSwap(nil, err.Error())
				}
				calls.Add(1)
			}
		}()
	}
	for calls.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	fmt.Println("loaded")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes it
	close(stop)
	wg.Wait()
	firstErr, _ := first.Load().(string)
	b, _ := json.Marshal(pauseCounts{Calls: calls.Load(), Errors: errs.Load(), Stalls: s.Stats().Stalls, Openings: int64(s.Shards()[0].Openings), First: firstErr})
	fmt.Println(string(b))
	_ = s.Close()
	os.Exit(0)
}

// Without a breaker, the calls queued behind a stalled pipeline fail at
// the same judgement, as the calls in it do: one stall, not one more per
// pipeline sent after it (with one pipeline in flight, each queued call
// would otherwise wait a threshold of its own).
func TestQueuedCallsFailWithAStallWithoutABreaker(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	const th = 20 * time.Millisecond
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: th, Pipelines: 1, Breaker: BreakerOptions{Disabled: true}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	g := testGroup
	_, err = s.Take(context.Background(), g)
	require.NoError(t, err)
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
