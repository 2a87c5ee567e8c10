package node

import (
	"context"
	"net"
	"sync"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/allot-dev/allot/internal/server"
)

// GRPCLimits bound what callers can hold of the gRPC listener. Zero fields
// take the defaults below. The receive limit is not a knob: it is
// server.MaxMessageBytes, the largest legal call.
type GRPCLimits struct {
	// MaxConnections is the most connections served at once; more wait in
	// the kernel's accept queue until one closes (netutil.LimitListener).
	// Negative: unlimited.
	MaxConnections int
	// MaxStreams is the most concurrent calls on one connection.
	MaxStreams uint32
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface: a connection that never speaks is closed after it
	// (grpc-go's default is 120 s).
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection with no call in flight for this
	// long; clients reconnect transparently.
	IdleTimeout time.Duration
	// MaxInFlight is the most calls in progress on the whole listener; a
	// call beyond it is refused at once with UNAVAILABLE, before its
	// message is read. It is what bounds the memory a flood of legal-size
	// messages can pin: about MaxInFlight x server.MaxMessageBytes.
	// Negative: unlimited.
	MaxInFlight int
}

// Defaults of GRPCLimits. With them, the memory callers can pin with
// messages in flight is about MaxInFlight x server.MaxMessageBytes
// (512 x 3.1 MiB): a message larger than the limit is refused from its
// length prefix, and a call beyond MaxInFlight before its message is read.
const (
	DefaultGRPCMaxConnections   = 4096
	DefaultGRPCMaxStreams       = 100
	DefaultGRPCHandshakeTimeout = 5 * time.Second
	DefaultGRPCIdleTimeout      = 5 * time.Minute
	DefaultGRPCMaxInFlight      = 512
)

// maxHeaderBytes bounds one request's headers on every listener: gRPC
// metadata, which grpc-go accepts up to 16 MiB of (and HPACK lets a few
// bytes on the wire name an entry of its 4 KiB table again and again),
// and HTTP headers, net/http's default 1 MiB. Held once per connection
// being read and per call in flight, those defaults came to gigabytes.
// 64 KiB is Envoy's order (max_request_headers_kb, 60 by default) and
// eight times what grpc-java accepts by default: no legal caller nears it.
const maxHeaderBytes = 64 << 10

// Keepalive: pings from clients more often than keepaliveMinTime are a
// GOAWAY (a ping flood is cheap to send); the server pings an idle peer
// every keepaliveTime and drops it if no answer comes in keepaliveTimeout.
const (
	keepaliveMinTime = 10 * time.Second
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
)

func (l GRPCLimits) withDefaults() GRPCLimits {
	if l.MaxConnections == 0 {
		l.MaxConnections = DefaultGRPCMaxConnections
	}
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultGRPCMaxStreams
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = DefaultGRPCHandshakeTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultGRPCIdleTimeout
	}
	if l.MaxInFlight == 0 {
		l.MaxInFlight = DefaultGRPCMaxInFlight
	}
	return l
}

// inFlight is the listener-wide cap on calls in progress. Its tap runs
// when a call's headers arrive (under the transport's lock, so it must not
// block) and takes a slot or refuses the call. The slot goes back when the
// call's handler returns (the interceptors below), which costs a lock and
// no goroutine. A call that passed the tap but never reaches a handler
// (an unknown or malformed method, a message refused while it is read, a
// stream reset first) leaves its slot taken; those are reclaimed when the
// table is full, by a sweep for slots whose call has ended (its context
// is done: grpc-go cancels every stream's context when the stream ends).
//
// Why not context.AfterFunc on the call's context: it costs five
// allocations and a goroutine per call, about 2 µs of CPU
// (BenchmarkInFlightTap), 2-3 % of a busy node.
type inFlight struct {
	mu    sync.Mutex
	free  []*callSlot // the slots not in use
	slots []callSlot
	// lastSweep rate-limits sweeps to one per sweepEvery, so a flood of
	// refused calls costs a scan per millisecond, not per call.
	lastSweep time.Time
	now       func() time.Time
	sweeps    int // sweeps run (for tests)
}

// callSlot is one call's place in the table. done is the call's
// Done channel while it is in use and nil while it is free: it is how a
// sweep tells an ended call, and how a handler tells that the slot it
// was given is still its own (a sweep may have reclaimed and re-issued it
// once the call's context ended).
type callSlot struct {
	done <-chan struct{}
}

const sweepEvery = time.Millisecond

func newInFlight(n int, now func() time.Time) *inFlight {
	f := &inFlight{slots: make([]callSlot, n), free: make([]*callSlot, n), now: now}
	for i := range f.slots {
		f.free[i] = &f.slots[i]
	}
	return f
}

type slotKey struct{}

// rlqsStream is the RLQS stream's method: its streams live as long as
// their clients, so they are capped by the RLQS server itself
// (rlqs.Config.MaxStreams), not by the slots of calls in progress, which
// 600 of them once took from every check (issue 43).
var rlqsStream = "/" + rlqsv3.RateLimitQuotaService_ServiceDesc.ServiceName + "/" + rlqsv3.RateLimitQuotaService_ServiceDesc.Streams[0].StreamName

func (f *inFlight) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	done := ctx.Done()
	if done == nil || info.FullMethodName == rlqsStream {
		// Not a stream's context (grpc-go's always has one): nothing
		// could tell when the call ends, so it is not counted.
		return ctx, nil
	}
	f.mu.Lock()
	if len(f.free) == 0 {
		f.sweepLocked()
	}
	if len(f.free) == 0 {
		f.mu.Unlock()
		// UNAVAILABLE, as every shed answer of the node: to a rate
		// limiter's callers RESOURCE_EXHAUSTED reads as "rate limited".
		return nil, status.Errorf(codes.Unavailable, "allot: node overloaded: %d gRPC calls already in progress (a quarter of --max-inflight): retry, or use another node", len(f.slots))
	}
	s := f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	s.done = done
	f.mu.Unlock()
	return context.WithValue(ctx, slotKey{}, s), nil
}

// sweepLocked frees the slots of calls that ended without reaching a
// handler, at most once per sweepEvery.
func (f *inFlight) sweepLocked() {
	now := f.now()
	if now.Sub(f.lastSweep) < sweepEvery {
		return
	}
	f.lastSweep = now
	f.sweeps++
	for i := range f.slots {
		s := &f.slots[i]
		if s.done == nil {
			continue
		}
		select {
		case <-s.done:
			s.done = nil
			f.free = append(f.free, s)
		default:
		}
	}
}

// end gives back the slot of the call whose handler is returning.
func (f *inFlight) end(ctx context.Context) {
	s, ok := ctx.Value(slotKey{}).(*callSlot)
	if !ok {
		return
	}
	done := ctx.Done()
	f.mu.Lock()
	if s.done == done { // not reclaimed by a sweep since
		s.done = nil
		f.free = append(f.free, s)
	}
	f.mu.Unlock()
}

// serverOptions install the table: the tap, and the interceptors that
// give slots back. They must come before any option that derives a
// cancellable context for the handler: a handler's slot is matched by
// its context's Done channel.
func (f *inFlight) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InTapHandle(f.tap), grpc.ChainUnaryInterceptor(f.unary), grpc.ChainStreamInterceptor(f.stream)}
}

func (f *inFlight) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	defer f.end(ctx)
	return h(ctx, req)
}

func (f *inFlight) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	defer f.end(ss.Context())
	return h(srv, ss)
}

func (l GRPCLimits) serverOptions() []grpc.ServerOption {
	l = l.withDefaults()
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(server.MaxMessageBytes),
		grpc.MaxHeaderListSize(maxHeaderBytes),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.IdleTimeout, Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}
	if l.MaxInFlight > 0 {
		opts = append(opts, newInFlight(l.MaxInFlight, time.Now).serverOptions()...)
	}
	return opts
}

func (l GRPCLimits) listener(lis net.Listener) net.Listener {
	return limitConnections(lis, l.withDefaults().MaxConnections)
}

// limitConnections serves at most n of lis's connections at once; more
// wait in the kernel's accept queue. Negative n: unlimited.
func limitConnections(lis net.Listener, n int) net.Listener {
	if n < 0 {
		return lis
	}
	return netutil.LimitListener(lis, n)
}
