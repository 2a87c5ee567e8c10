package node

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/allot-dev/allot/internal/testenv/fakeclock"
)

func newClock() *fakeclock.Clock      { return fakeclock.New(time.Unix(1e9, 0)) }
func call() (context.Context, func()) { return context.WithCancel(context.Background()) }
func refused(t *testing.T, err error) {
	t.Helper()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "overloaded")
}

// A slot comes back when its handler returns, with no sweep.
func TestInFlightSlotBackAtHandlerEnd(t *testing.T) {
	clk := newClock()
	f := newInFlight(2, clk.Now)
	a, stopA := call()
	defer stopA()
	b, stopB := call()
	defer stopB()
	ca, err := f.tap(a, &tap.Info{})
	require.NoError(t, err)
	_, err = f.tap(b, &tap.Info{})
	require.NoError(t, err)
	c, stopC := call()
	defer stopC()
	_, err = f.tap(c, &tap.Info{})
	refused(t, err)

	f.end(ca)
	_, err = f.tap(c, &tap.Info{})
	require.NoError(t, err, "the ended handler's slot is free")
	assert.Equal(t, 1, f.sweeps, "only the refusal swept")
}

// A call that never reached a handler (its context ended, no end) has its
// slot reclaimed by the sweep a full table runs, at most once per
// sweepEvery.
func TestInFlightSweepReclaimsEndedCalls(t *testing.T) {
	clk := newClock()
	f := newInFlight(1, clk.Now)
	a, stopA := call()
	_, err := f.tap(a, &tap.Info{})
	require.NoError(t, err)

	b, stopB := call()
	defer stopB()
	_, err = f.tap(b, &tap.Info{})
	refused(t, err) // a is still in progress: the sweep finds nothing
	require.Equal(t, 1, f.sweeps)

	stopA() // a's stream ended without reaching a handler
	_, err = f.tap(b, &tap.Info{})
	refused(t, err)
	assert.Equal(t, 1, f.sweeps, "no second sweep within sweepEvery")

	clk.Advance(sweepEvery)
	_, err = f.tap(b, &tap.Info{})
	require.NoError(t, err, "the sweep reclaimed the ended call's slot")
	assert.Equal(t, 2, f.sweeps)
}

// A handler whose slot a sweep reclaimed (its context ended while it
// ran) does not give back the slot again: that would free the slot of
// the call it was re-issued to.
func TestInFlightReclaimedSlotIsNotFreedTwice(t *testing.T) {
	clk := newClock()
	f := newInFlight(1, clk.Now)
	a, stopA := call()
	ca, err := f.tap(a, &tap.Info{})
	require.NoError(t, err)
	stopA()
	b, stopB := call()
	defer stopB()
	_, err = f.tap(b, &tap.Info{})
	require.NoError(t, err, "a's ended call was reclaimed for b")

	f.end(ca) // a's handler returns late
	c, stopC := call()
	defer stopC()
	clk.Advance(sweepEvery)
	_, err = f.tap(c, &tap.Info{})
	refused(t, err) // b still holds the only slot
}

// Many calls at once, some ending through their handler, some only
// through their context: never more slots taken than the cap, and every
// slot free once all calls have ended.
func TestInFlightStress(t *testing.T) {
	const slots, workers, calls = 8, 16, 2000
	f := newInFlight(slots, time.Now)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range calls {
				ctx, cancel := call()
				c, err := f.tap(ctx, &tap.Info{})
				if err != nil {
					cancel()
					continue
				}
				f.mu.Lock()
				inUse := len(f.slots) - len(f.free)
				f.mu.Unlock()
				if inUse > slots || inUse < 1 {
					t.Errorf("%d slots in use of %d", inUse, slots)
				}
				switch r.IntN(3) {
				case 0: // the usual call: handler returns, then the stream ends
					f.end(c)
					cancel()
				case 1: // never reached a handler
					cancel()
				default: // client went away while the handler ran
					cancel()
					f.end(c)
				}
			}
		})
	}
	wg.Wait()
	f.mu.Lock()
	f.lastSweep = time.Time{}
	f.sweepLocked()
	free := len(f.free)
	f.mu.Unlock()
	assert.Equal(t, slots, free, "every slot is free once every call has ended")
}

// Through a real gRPC server, calls with and without a deadline give
// their slot back as their handler returns: grpc-go's stream context
// (whose Done channel the slot keeps) is the one the handler sees, so no
// sweep is ever needed for calls that reach a handler.
func TestInFlightFastPathThroughGRPC(t *testing.T) {
	const slots = 4
	f := newInFlight(slots, time.Now)
	srv := grpc.NewServer(f.serverOptions()...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	c := healthpb.NewHealthClient(conn)
	for i := range 3 * slots {
		ctx, cancel := context.Background(), func() {}
		if i%2 == 0 {
			ctx, cancel = context.WithTimeout(ctx, 30*time.Second) // a grpc-timeout header
		}
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		require.NoError(t, err, "call %d", i)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Len(t, f.free, slots, "every slot is back")
	assert.Zero(t, f.sweeps, "without a sweep")
}

// RLQS streams live as long as their clients: they take no slot of the
// calls in progress (the RLQS server caps them itself).
func TestInFlightLeavesRLQSStreamsOut(t *testing.T) {
	f := newInFlight(1, newClock().Now)
	for range 3 {
		s, stop := call()
		defer stop()
		_, err := f.tap(s, &tap.Info{FullMethodName: "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"})
		require.NoError(t, err)
	}
	c, stop := call()
	defer stop()
	_, err := f.tap(c, &tap.Info{FullMethodName: "/allot.ratelimit.v1.RateLimiterService/CheckRateLimit"})
	require.NoError(t, err, "the slot is still free for a check")
}
