package node

import (
	"net"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/allot-dev/allot/server"
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
}

// Defaults of GRPCLimits. With them, the memory callers can pin with
// messages in flight is at most MaxConnections x MaxStreams x
// server.MaxMessageBytes in theory, and one message per call in practice:
// a message larger than the limit is refused from its length prefix.
const (
	DefaultGRPCMaxConnections   = 4096
	DefaultGRPCMaxStreams       = 100
	DefaultGRPCHandshakeTimeout = 5 * time.Second
	DefaultGRPCIdleTimeout      = 5 * time.Minute
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
	return l
}

func (l GRPCLimits) serverOptions() []grpc.ServerOption {
	l = l.withDefaults()
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(server.MaxMessageBytes),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.IdleTimeout, Time: keepaliveTime, Timeout: keepaliveTimeout}),
	}
}

func (l GRPCLimits) listener(lis net.Listener) net.Listener {
	l = l.withDefaults()
	if l.MaxConnections < 0 {
		return lis
	}
	return netutil.LimitListener(lis, l.MaxConnections)
}
