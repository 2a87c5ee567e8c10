package main

import (
	"log/slog"

	"github.com/allot-dev/allot/cmd/internal/transportflags"
	"github.com/allot-dev/allot/internal/node"
)

// transport builds node.Transport from the transport-security flags
// (README, "Transport security") and the --redis value, and returns the
// Redis addresses; certificate files are read here, so a bad one stops
// the node before it listens.
func transport(f *transportflags.Flags, redis string, log *slog.Logger) (node.Transport, []string, error) {
	var t node.Transport
	var err error
	if t.TLS, err = f.Server(log); err != nil {
		return t, nil, err
	}
	r, err := f.Redis(redis, log)
	if err != nil {
		return t, nil, err
	}
	t.RedisUsername, t.RedisPassword, t.RedisTLS = r.Username, r.Password, r.TLS
	t.NATS, err = f.NATS(log)
	return t, r.Addrs, err
}
