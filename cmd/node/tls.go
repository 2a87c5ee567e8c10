package main

import (
	"flag"
	"log/slog"

	"github.com/allot-dev/allot/cmd/internal/transportflags"
	"github.com/allot-dev/allot/internal/node"
)

// transportFlags declares the transport-security flags (README,
// "Transport security") and returns a function that builds
// node.Transport from them after parsing; certificate files are read
// there, so a bad one stops the node before it listens.
func transportFlags(fs *flag.FlagSet) func(log *slog.Logger) (node.Transport, error) {
	f := transportflags.Register(fs, "gRPC, HTTP, proxy and admin API")
	return func(log *slog.Logger) (node.Transport, error) {
		var t node.Transport
		var err error
		if t.TLS, err = f.Server(log); err != nil {
			return t, err
		}
		if t.RedisUsername, t.RedisPassword, t.RedisTLS, err = f.Redis(log); err != nil {
			return t, err
		}
		t.NATS, err = f.NATS(log)
		return t, err
	}
}
