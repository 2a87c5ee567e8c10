package node_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/testenv/natstest"
)

// TestNATSTLSAndUserPassword loads the policies from a NATS server that
// requires TLS and a user name and password.
func TestNATSTLSAndUserPassword(t *testing.T) {
	f := newTLSFixture(t)
	srv := natstest.ServerWith(t, natstest.Options{
		TLS:      &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{f.server.TLS(t)}},
		Username: "allot", Password: "s3cret",
	})
	url := srv.ClientURL()
	secure := nats.Secure(f.client(t, false))
	start := func(opts ...nats.Option) (*node.Node, error) {
		return node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", StoreURL: url, Transport: node.Transport{NATS: opts}})
	}
	for name, opts := range map[string][]nats.Option{
		"plaintext":      {nats.UserInfo("allot", "s3cret")},
		"no credentials": {secure},
		"wrong password": {secure, nats.UserInfo("allot", "guess")},
		"untrusted CA":   {nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12}), nats.UserInfo("allot", "s3cret")},
	} {
		n, err := start(opts...)
		if !assert.Error(t, err, name) {
			assert.NoError(t, n.Close(5*time.Second))
		}
	}
	n, err := start(secure, nats.UserInfo("allot", "s3cret"))
	require.NoError(t, err)
	assert.NoError(t, n.Close(5*time.Second))
}
