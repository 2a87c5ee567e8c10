package transportflags_test

import (
	"crypto/tls"
	"flag"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/cmd/internal/transportflags"
	"github.com/allot-dev/allot/internal/certtest"
	"github.com/allot-dev/allot/internal/natstest"
)

// natsOptions parses args as allot-node does and returns the NATS
// connection options they build.
func natsOptions(t *testing.T, args ...string) ([]nats.Option, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := transportflags.Register(fs, "test")
	require.NoError(t, fs.Parse(args))
	return f.NATS(nil)
}

// connect connects to url with the options args build, and closes the
// connection if it was made.
func connect(t *testing.T, url string, args ...string) error {
	t.Helper()
	opts, err := natsOptions(t, args...)
	require.NoError(t, err)
	nc, err := nats.Connect(url, opts...)
	if err == nil {
		nc.Close()
	}
	return err
}

// TestNATSCredsFlag connects with --nats-creds to a NATS server in
// operator (JWT) mode; a user of another operator is refused.
func TestNATSCredsFlag(t *testing.T) {
	dir := t.TempDir()
	op := natstest.NewOperator(t, "allot")
	creds := op.Account(t, "ALLOT", true).Creds(t, dir, "node")
	url := natstest.ServerWith(t, natstest.Options{Operator: op}).ClientURL()

	require.NoError(t, connect(t, url, "--nats-creds", creds))
	stranger := natstest.NewOperator(t, "other").Account(t, "ALLOT", true).Creds(t, dir, "stranger")
	assert.ErrorIs(t, connect(t, url, "--nats-creds", stranger), nats.ErrAuthorization)
	assert.ErrorIs(t, connect(t, url), nats.ErrAuthorization)

	_, err := natsOptions(t, "--nats-creds", creds, "--nats-user", "allot")
	assert.Error(t, err, "--nats-creds with --nats-user")
}

// TestNATSClientCertFlags connects with --nats-tls-ca, --nats-tls-cert
// and --nats-tls-key to a NATS server with verify: true (mTLS); without
// the client certificate it is refused.
func TestNATSClientCertFlags(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "allot test CA")
	caFile := ca.WriteCA(t, dir, "ca")
	cert, key := ca.Client(t, "allot-node").Write(t, dir, "client")
	url := natstest.ServerWith(t, natstest.Options{TLS: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{ca.Server(t).TLS(t)},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool(),
	}}).ClientURL()

	require.NoError(t, connect(t, url, "--nats-tls-ca", caFile, "--nats-tls-cert", cert, "--nats-tls-key", key))
	// With TLS 1.3 the refusal surfaces as "certificate required" or as
	// a closed connection, depending on timing: only its failing is
	// asserted.
	assert.Error(t, connect(t, url, "--nats-tls-ca", caFile), "no client certificate")
}
