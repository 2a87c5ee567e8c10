package node

import (
	"context"
	"net"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

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
// block) and takes a slot or refuses the call; the slot is given back
// when the call's context ends, which grpc-go does for every call that
// passed the tap.
type inFlight chan struct{}

func (f inFlight) tap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	select {
	case f <- struct{}{}:
		context.AfterFunc(ctx, func() { <-f })
		return ctx, nil
	default:
		// UNAVAILABLE, as every shed answer of the node: to a rate
		// limiter's callers RESOURCE_EXHAUSTED reads as "rate limited".
		return nil, status.Errorf(codes.Unavailable, "allot: node overloaded: %d gRPC calls already in progress (--grpc-max-inflight): retry, or use another node", cap(f))
	}
}

func (l GRPCLimits) serverOptions() []grpc.ServerOption {
	l = l.withDefaults()
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(server.MaxMessageBytes),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.IdleTimeout, Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}
	if l.MaxInFlight > 0 {
		opts = append(opts, grpc.InTapHandle(make(inFlight, l.MaxInFlight).tap))
	}
	return opts
}

func (l GRPCLimits) listener(lis net.Listener) net.Listener {
	l = l.withDefaults()
	if l.MaxConnections < 0 {
		return lis
	}
	return netutil.LimitListener(lis, l.MaxConnections)
}
