package region_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/region"
)

// slowReader is a connection this process reads late: every Read first
// sleeps, as a node does when its goroutines wait for a CPU. Redis has
// answered long before; the reply waits in the socket.
type slowReader struct {
	net.Conn
	delay time.Duration
}

func (c *slowReader) Read(b []byte) (int, error) {
	time.Sleep(c.delay) // the simulated lag itself, not synchronisation
	return c.Conn.Read(b)
}

func (c *slowReader) SyscallConn() (syscall.RawConn, error) {
	return c.Conn.(syscall.Conn).SyscallConn()
}

// TestBusyNodeIsNotAStoreFailure: a node that reads Redis's replies 20 ms
// late (five times the 4 ms stall threshold) is slow, but the shard is
// healthy: the replies wait unread in its sockets. No call fails, no stall
// is counted, the breaker stays closed. (Before, a 4 ms wall-clock deadline
// per call failed every one of these calls as a store failure.)
func TestBusyNodeIsNotAStoreFailure(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	var d net.Dialer
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &slowReader{Conn: c, delay: 20 * time.Millisecond}, nil
	}
	s := openWith(t, region.Options{Dialer: dial}, in.Addr)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for range 4 {
		wg.Go(func() {
			for range 10 {
				_, _, err := take(s, "rl:{busy}:x")
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, int64(0), s.Stats().Stalls)
	h := s.Shards()
	require.Len(t, h, 1)
	assert.Equal(t, region.BreakerClosed, h[0].State)
	assert.Equal(t, uint64(0), h[0].Openings)
	r := takeOK(t, s, "rl:{busy}:x")
	assert.Equal(t, int64(100-41), r, "every call counted once")
}

// TestConcurrentCallsShareRoundTrips: while a pipeline is in flight,
// calls bound for the same shard queue and go out together in the next
// one. 64 concurrent takes on one key over a link with 10 ms latency and
// one pipeline in flight at a time need a handful of round trips, and
// each caller gets its own answer: the 64 remainders are 99 down to 36,
// each once. The checks of each round trip share one EVALSHA of
// check_tb.lua, so Redis runs as many scripts as there were round trips.
func TestConcurrentCallsShareRoundTrips(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	s, err := region.Open(context.Background(), []string{p.Addr}, region.Options{Timeout: time.Second, Pipelines: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	takeOK(t, s, "rl:{warm}:x")
	p.SetLatency(10 * time.Millisecond)
	direct := redis.NewClient(&redis.Options{Addr: in.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	require.NoError(t, direct.ConfigResetStat(context.Background()).Err())
	before := s.Stats()
	const n = 64
	var wg sync.WaitGroup
	rems := make(chan int64, n)
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			res, err := s.Take(context.Background(), []algorithm.Group{{{Key: "rl:{shared}:x", Spec: daily, Cost: 1}}})
			if assert.NoError(t, err) {
				rems <- res[0].Items[0].Remaining
			}
		})
	}
	close(start)
	wg.Wait()
	close(rems)
	seen := map[int64]bool{}
	for r := range rems {
		assert.False(t, seen[r], "remaining %d answered twice", r)
		seen[r] = true
	}
	for r := int64(100 - n); r < 100; r++ {
		assert.True(t, seen[r], "remaining %d missing", r)
	}
	after := s.Stats()
	calls, trips := after.Calls-before.Calls, after.Pipelines-before.Pipelines
	assert.Equal(t, int64(n), calls)
	assert.LessOrEqual(t, trips, int64(n/4), "%d calls in %d round trips", calls, trips)
	assert.Equal(t, trips, redistest.Calls(t, direct, "evalsha"), "one script per round trip")
	t.Logf("%d calls in %d round trips", calls, trips)
}

// TestFullQueueSheds: calls beyond the queue bound are shed at once with
// an overloaded error (decide.IsOverloaded), which the breaker does not
// count: overload is not a store failure.
func TestFullQueueSheds(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	s, err := region.Open(context.Background(), []string{p.Addr}, region.Options{Timeout: time.Second, Pipelines: 1, MaxBatch: 1, MaxQueue: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	takeOK(t, s, "rl:{warm}:x")
	p.SetLatency(20 * time.Millisecond)
	const n = 30
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ok, shed int
	for range n {
		wg.Go(func() {
			_, _, err := take(s, "rl:{q}:x")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case decide.IsOverloaded(err):
				require.ErrorIs(t, err, region.ErrOverloaded)
				shed++
			default:
				t.Errorf("neither answered nor shed: %v", err)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, n, ok+shed)
	assert.Positive(t, shed)
	assert.GreaterOrEqual(t, ok, 5, "one in flight and four queued at least")
	assert.Equal(t, int64(shed), s.Stats().Shed)
	h := s.Shards()[0]
	assert.Equal(t, region.BreakerClosed, h.State)
	assert.Zero(t, h.Failed)
}

// TestBlipCostsABlip: Redis killed and restarted 200 ms later, under a
// steady trickle of calls. The breaker opens, its background probes back
// off from 50 ms, and the store is back on Redis well within a second of
// the restart rather than after a fixed 5 s open period.
func TestBlipCostsABlip(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	s := openWith(t, region.Options{}, in.Addr)
	takeOK(t, s, "rl:{blip}:x")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // a trickle of calls, as a node under traffic
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				_, _, _ = take(s, "rl:{blip}:x")
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	in.Kill()
	require.Eventually(t, func() bool { return s.Shards()[0].State != region.BreakerClosed }, 5*time.Second, time.Millisecond, "the dead shard's breaker opens")
	time.Sleep(200 * time.Millisecond) // the fault's length: what is measured
	in.Restart()
	restarted := time.Now()
	require.Eventually(t, func() bool { return s.Shards()[0].State == region.BreakerClosed }, 10*time.Second, time.Millisecond)
	back := time.Since(restarted)
	t.Logf("back on Redis %v after the restart (openings %d, failed probes %d)", back, s.Shards()[0].Openings, s.Shards()[0].ProbeFailures)
	// The backoff after a 200 ms fault is at most 400 ms (50+100+200+400
	// ms of waits); 3 s leaves room for a loaded CI machine under -race.
	assert.Less(t, back, 3*time.Second)
	_, _, err := take(s, "rl:{blip}:x")
	require.NoError(t, err)
}

// TestGivenUpCallsNeverAnswerAnother: a request is answered on a channel
// the store reuses. Callers that give up (their ctx ends while the
// pipeline is out) and callers that wait share the pipelines, over a
// link of 1 ms; each waiting caller must get its own answer, never a
// signal left over from another request: every take either answers its
// one item or fails as overloaded, and no decoding ever sees a reply
// that was not set.
func TestGivenUpCallsNeverAnswerAnother(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	p := faultproxy.New(t, in.Addr)
	s, err := region.Open(context.Background(), []string{p.Addr}, region.Options{Timeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	p.SetLatency(time.Millisecond)
	var wg sync.WaitGroup
	var answered, gaveUp atomic.Int64
	for w := range 16 {
		wg.Go(func() {
			for i := range 200 {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if (w+i)%3 == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i%4)*500*time.Microsecond)
				}
				res, err := s.Take(ctx, []algorithm.Group{{{Key: "rl:{stress}:x", Spec: tb(1_000_000_000, time.Second, 0), Cost: 1}}})
				cancel()
				if err != nil {
					assert.True(t, decide.IsOverloaded(err), "worker %d take %d: %v", w, i, err)
					gaveUp.Add(1)
					continue
				}
				if assert.Len(t, res, 1) && assert.Len(t, res[0].Items, 1) {
					assert.True(t, res[0].Allowed)
					answered.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d answered, %d given up", answered.Load(), gaveUp.Load())
	assert.Positive(t, answered.Load())
	assert.Positive(t, gaveUp.Load(), "no caller gave up: the test exercised one path only")
}
