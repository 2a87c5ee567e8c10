package node

import (
	"crypto/tls"
	"net"
	"net/http"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/internal/tlsconfig"
	"github.com/allot-dev/allot/region"
)

// Transport is the node's transport security: TLS (or mTLS) on its
// listeners, and credentials and TLS on its connections to Redis and
// NATS. The zero value is plaintext everywhere, without credentials.
type Transport struct {
	// TLS, when set, serves gRPC, HTTP, the reverse proxy and the admin
	// API over TLS with its certificate, which it reloads when the files
	// change; with a client CA every listener requires client
	// certificates (mTLS).
	TLS *tlsconfig.Server
	// RedisUsername and RedisPassword authenticate to the region's Redis
	// (an ACL user, or only a password for the default user).
	RedisUsername, RedisPassword string
	// RedisTLS, when set, connects to Redis over TLS (tlsconfig.NewClient).
	RedisTLS *tls.Config
	// NATS are extra connection options (credentials, TLS) for every NATS
	// connection: the policy store and the multi-region demand publisher.
	NATS []nats.Option
}

// grpcOptions are the gRPC server's transport credentials.
func (t Transport) grpcOptions() []grpc.ServerOption {
	if t.TLS == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(t.TLS.Config("h2")))}
}

// serveHTTP serves srv on lis, over TLS when configured.
func (t Transport) serveHTTP(srv *http.Server, lis net.Listener) error {
	if t.TLS == nil {
		return srv.Serve(lis)
	}
	// ServeTLS takes the certificate from TLSConfig (empty file names)
	// and sets up HTTP/2 as well.
	srv.TLSConfig = t.TLS.Config("h2", "http/1.1")
	return srv.ServeTLS(lis, "", "")
}

// listener wraps the admin API's listener in TLS when configured. The
// admin server is admin.Serve's own and speaks HTTP/1.1 only.
func (t Transport) listener(lis net.Listener) net.Listener {
	if t.TLS == nil {
		return lis
	}
	return tls.NewListener(lis, t.TLS.Config("http/1.1"))
}

// region adds the Redis credentials and TLS to o.
func (t Transport) region(o region.Options) region.Options {
	o.Username, o.Password, o.TLSConfig = t.RedisUsername, t.RedisPassword, t.RedisTLS
	return o
}
