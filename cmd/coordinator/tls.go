package main

import (
	"crypto/tls"
	"log/slog"
	"net"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/cmd/internal/transportflags"
	"github.com/allot-dev/allot/internal/tlsconfig"
	"github.com/allot-dev/allot/region"
)

// transport is the coordinator's transport security (README, "Transport
// security"): TLS on the admin listener, credentials and TLS towards the
// region's Redis and NATS.
type transport struct {
	tls        *tlsconfig.Server // nil: plaintext admin API
	redisAddrs []string
	redis      region.Options // Username, Password, TLSConfig
	nats       []nats.Option
}

// newTransport reads the flags' files and the --redis value; a bad one
// stops the coordinator before it listens.
func newTransport(f *transportflags.Flags, redis string, log *slog.Logger) (transport, error) {
	var t transport
	var err error
	if t.tls, err = f.Server(log); err != nil {
		return t, err
	}
	r, err := f.Redis(redis, log)
	if err != nil {
		return t, err
	}
	t.redisAddrs, t.redis.Username, t.redis.Password, t.redis.TLSConfig = r.Addrs, r.Username, r.Password, r.TLS
	t.nats, err = f.NATS(log)
	return t, err
}

// listener wraps the admin listener in TLS when configured (admin.Serve
// speaks HTTP/1.1).
func (t transport) listener(lis net.Listener) net.Listener {
	if t.tls == nil {
		return lis
	}
	return tls.NewListener(lis, t.tls.Config("http/1.1"))
}
