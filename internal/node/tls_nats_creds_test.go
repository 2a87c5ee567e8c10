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

// startNATSStoreNode starts a node whose policy store is the NATS KV at
// url, connecting with opts (node.Transport.NATS, as --nats-* build it).
func startNATSStoreNode(url string, opts ...nats.Option) (*node.Node, error) {
	return node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", StoreURL: url, Transport: node.Transport{NATS: opts}})
}

// TestNATSCreds loads the policies from a NATS server in operator (JWT)
// mode, connecting with a .creds file as --nats-creds does: the policy
// store's KV bucket lives in the user's account, whose JWT enables
// JetStream. Users the server cannot trace to its operator are refused.
func TestNATSCreds(t *testing.T) {
	dir := t.TempDir()
	op := natstest.NewOperator(t, "allot")
	acct := op.Account(t, "ALLOT", true)
	srv := natstest.ServerWith(t, natstest.Options{Operator: op})
	url := srv.ClientURL()

	other := natstest.NewOperator(t, "other")
	for name, opts := range map[string][]nats.Option{
		"no credentials":       nil,
		"user and password":    {nats.UserInfo("allot", "s3cret")},
		"other operator":       {nats.UserCredentials(other.Account(t, "ALLOT", true).Creds(t, dir, "stranger"))},
		"unregistered account": {nats.UserCredentials(op.Account(t, "GONE", false).Creds(t, dir, "orphan"))},
	} {
		n, err := startNATSStoreNode(url, opts...)
		if !assert.ErrorIs(t, err, nats.ErrAuthorization, name) && err == nil {
			assert.NoError(t, n.Close(5*time.Second))
		}
	}

	// The options --nats-creds builds (transportflags.Flags.NATS).
	n, err := startNATSStoreNode(url, nats.UserCredentials(acct.Creds(t, dir, "node")))
	require.NoError(t, err)
	assert.NoError(t, n.Close(5*time.Second))
}

// TestNATSClientCertificate loads the policies from a NATS server with
// verify: true (mTLS), connecting with the client certificate as
// --client-tls-cert and --client-tls-key do; without one it is refused.
func TestNATSClientCertificate(t *testing.T) {
	f := newTLSFixture(t)
	srv := natstest.ServerWith(t, natstest.Options{TLS: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{f.server.TLS(t)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    f.ca.Pool(),
	}})
	url := srv.ClientURL()

	// Every client trusts the server's CA: each is refused for its
	// client certificate alone.
	stranger := newTLSFixture(t) // a client certificate of another CA
	foreign := f.client(t, false)
	foreign.Certificates = stranger.client(t, true).Certificates
	for name, opts := range map[string][]nats.Option{
		"no client cert":       {nats.Secure(f.client(t, false))},
		"client cert of other": {nats.Secure(foreign)},
	} {
		n, err := startNATSStoreNode(url, opts...)
		if !assert.Error(t, err, name) {
			assert.NoError(t, n.Close(5*time.Second))
		}
	}

	// TLS with the client certificate, as the --client-tls-* files give
	// (cmd/internal/transportflags).
	n, err := startNATSStoreNode(url, nats.Secure(f.client(t, true)))
	require.NoError(t, err)
	assert.NoError(t, n.Close(5*time.Second))
}
