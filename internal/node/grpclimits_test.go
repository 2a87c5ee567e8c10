package node_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/server"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

func startLimited(t *testing.T, l node.GRPCLimits) *node.Node {
	t.Helper()
	n, _ := nodetest.Start(t, testPolicies, node.Config{GRPCLimits: l})
	return n
}

func dialClient(t *testing.T, addr string) ratelimitv1.RateLimiterServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return ratelimitv1.NewRateLimiterServiceClient(conn)
}

// largestBatch is a legal batch as large as one can be: MaxBatch checks
// with every field at its length limit.
func largestBatch() *ratelimitv1.BatchRateLimitRequest {
	one := &ratelimitv1.RateLimitRequest{
		TenantId:         strings.Repeat("t", decide.MaxIdentityLen),
		ClientIdentifier: strings.Repeat("c", decide.MaxIdentityLen),
		Tier:             strings.Repeat("r", decide.MaxIdentityLen),
		Route:            "/" + strings.Repeat("x", decide.MaxRouteLen-1),
		Method:           strings.Repeat("M", decide.MaxMethodLen),
		Ip:               "fe80::1%" + strings.Repeat("z", 64-len("fe80::1%")), // 64 bytes, the limit
		TokenCost:        decide.MaxCost,
	}
	b := &ratelimitv1.BatchRateLimitRequest{}
	for range server.MaxBatch {
		b.Requests = append(b.Requests, one)
	}
	return b
}

// The receive limit is the largest legal batch: that batch is served, a
// message one byte over the limit is RESOURCE_EXHAUSTED (refused from its
// length prefix). Before, grpc-go's 4 MiB default took it in and decoded it.
func TestGRPCReceiveLimitIsTheLargestLegalBatch(t *testing.T) {
	n := startLimited(t, node.GRPCLimits{})
	c := dialClient(t, n.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	big := largestBatch()
	require.LessOrEqual(t, proto.Size(big), server.MaxMessageBytes)
	_, err := c.CheckRateLimitBatch(ctx, big)
	require.NoError(t, err, "the largest legal batch (%d bytes) is served", proto.Size(big))

	over := &ratelimitv1.BatchRateLimitRequest{Requests: []*ratelimitv1.RateLimitRequest{{TenantId: "t"}}}
	pad := server.MaxMessageBytes + 1 - proto.Size(over)
	over.Requests[0].Route = strings.Repeat("x", pad-4) // tag and length of the route take the rest
	for proto.Size(over) <= server.MaxMessageBytes {
		over.Requests[0].Route += "x"
	}
	_, err = c.CheckRateLimitBatch(ctx, over)
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}

// A connection that never sends the HTTP/2 preface is closed after the
// handshake timeout (it was held for grpc-go's 120 s).
func TestSilentConnectionIsClosedAfterTheHandshakeTimeout(t *testing.T) {
	n := startLimited(t, node.GRPCLimits{HandshakeTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", n.Addr())
	require.NoError(t, err)
	defer conn.Close()
	// Fail, rather than hang, if the server keeps it: far beyond 200 ms
	// but far below 120 s.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.Copy(io.Discard, conn)
	require.NoError(t, err, "the server closed the silent connection (io.Copy saw EOF, not the deadline)")
}

// With MaxConnections held by silent connections, a new client waits; it
// is served once one of them goes.
func TestConnectionLimit(t *testing.T) {
	n := startLimited(t, node.GRPCLimits{MaxConnections: 1, HandshakeTimeout: time.Minute})
	hog, err := net.Dial("tcp", n.Addr())
	require.NoError(t, err)
	c := dialClient(t, n.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t"})
	cancel()
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	require.NoError(t, hog.Close())
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t"}, grpc.WaitForReady(true))
	require.NoError(t, err)
}

// Calls in progress on the whole listener are capped: past MaxInFlight a
// call is refused before its message is read, and the slot comes back
// when a call ends.
func TestInFlightLimit(t *testing.T) {
	n := startLimited(t, node.GRPCLimits{MaxInFlight: 1})
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	// A health watch is a call that stays in progress.
	wctx, stopWatch := context.WithCancel(context.Background())
	w, err := healthpb.NewHealthClient(conn).Watch(wctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	_, err = w.Recv()
	require.NoError(t, err)
	c := ratelimitv1.NewRateLimiterServiceClient(conn)
	_, err = c.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "t"})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "overloaded")

	stopWatch()
	require.Eventually(t, func() bool {
		_, err := c.CheckRateLimit(context.Background(), &ratelimitv1.RateLimitRequest{TenantId: "t"})
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the slot came back")
}

// Calls that take an in-flight slot but never reach a handler (an unknown
// method; a message refused from its length prefix) do not keep it: with
// room for one call, the next check is served.
func TestInFlightSlotOfACallThatNeverReachedAHandler(t *testing.T) {
	n := startLimited(t, node.GRPCLimits{MaxInFlight: 1})
	conn, err := grpc.NewClient(n.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	require.NoError(t, err)
	defer conn.Close()
	c := ratelimitv1.NewRateLimiterServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	servedAgain := func(what string) {
		t.Helper()
		require.EventuallyWithT(t, func(ct *assert.CollectT) {
			_, err := c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t"})
			assert.NoError(ct, err)
		}, 10*time.Second, 5*time.Millisecond, "a check is served after %s", what)
	}

	for range 3 {
		err = conn.Invoke(ctx, "/allot.nosuch.v1.Service/Nothing", &ratelimitv1.RateLimitRequest{}, &ratelimitv1.RateLimitResponse{})
		require.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
		servedAgain("an unknown method")
	}
	over := &ratelimitv1.RateLimitRequest{TenantId: "t", Route: strings.Repeat("x", server.MaxMessageBytes)}
	for range 3 {
		_, err = c.CheckRateLimit(ctx, over)
		require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
		servedAgain("a message refused while read")
	}
}

// A call's metadata is bounded (grpc-go's own bound is 16 MiB): the node
// advertises maxHeaderBytes, so grpc-go clients refuse to send more.
func TestGRPCHeaderListLimitIsAdvertised(t *testing.T) {
	n := startLimited(t, node.GRPCLimits{})
	c := dialClient(t, n.Addr())
	call := func(size int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "x-pad", strings.Repeat("x", size))
		_, err := c.CheckRateLimit(ctx, &ratelimitv1.RateLimitRequest{TenantId: "t"})
		return err
	}
	require.NoError(t, call(32<<10), "32 KiB of metadata is served")
	require.Error(t, call(100<<10), "a grpc-go client does not send 100 KiB")
	require.NoError(t, call(1), "the connection still serves")
}

// A client that ignores the advertised bound and sends 100 KiB of one
// header anyway (HEADERS and CONTINUATION frames, then the call's
// message) is refused before its call starts: its stream reset or its
// connection closed, never answered.
func TestGRPCHeaderListLimitIsEnforced(t *testing.T) {
	n := startLimited(t, node.GRPCLimits{})
	conn, err := net.Dial("tcp", n.Addr())
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	refused := func(err error) bool {
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server neither answered nor refused: %v", err)
		if err != nil {
			t.Logf("refused: the server closed the connection (%v)", err) // an HPACK string over the bound is a connection error
		}
		return err != nil
	}
	_, err = io.WriteString(conn, http2.ClientPreface)
	require.NoError(t, err)
	fr := http2.NewFramer(conn, conn)
	require.NoError(t, fr.WriteSettings())
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/allot.ratelimit.v1.RateLimiterService/CheckRateLimit"},
		{":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"x-pad", strings.Repeat("x", 100<<10)}} {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
	}
	b := block.Bytes()
	const chunk = 16 << 10 // the default SETTINGS_MAX_FRAME_SIZE
	if refused(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:chunk]})) {
		return
	}
	for b = b[chunk:]; len(b) > 0; {
		k := min(chunk, len(b))
		if refused(fr.WriteContinuation(1, k == len(b), b[:k])) {
			return
		}
		b = b[k:]
	}
	// The call's message (empty: a tenantless check), so that a server
	// that took the headers would answer.
	if refused(fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})) {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if refused(err) {
			return
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			assert.Equal(t, http2.ErrCodeFrameSize, f.ErrCode, "the stream is reset for its headers' size")
			return
		case *http2.GoAwayFrame:
			t.Logf("refused: GOAWAY %v", f.ErrCode)
			return
		case *http2.HeadersFrame:
			t.Fatalf("the server took the call (HEADERS on stream %d)", f.StreamID)
		case *http2.SettingsFrame:
			if !f.IsAck() {
				require.NoError(t, fr.WriteSettingsAck())
			}
		}
	}
}
