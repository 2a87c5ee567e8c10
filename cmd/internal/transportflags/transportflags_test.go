package transportflags_test

import (
	"context"
	"crypto/tls"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/cmd/internal/transportflags"
	"github.com/allot-dev/allot/internal/testenv/certtest"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/region"
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
}

// TestNATSClientCertFlags connects with --client-tls-ca, --client-tls-cert
// and --client-tls-key to a NATS server with verify: true (mTLS); without
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

	require.NoError(t, connect(t, url, "--client-tls-ca", caFile, "--client-tls-cert", cert, "--client-tls-key", key))
	// With TLS 1.3 the refusal surfaces as "certificate required" or as
	// a closed connection, depending on timing: only its failing is
	// asserted.
	assert.Error(t, connect(t, url, "--client-tls-ca", caFile), "no client certificate")
	assert.Error(t, connect(t, url, "--client-tls-cert", cert, "--client-tls-key", key), "the server's CA is not a system root")

	// The same files leave a plaintext NATS plaintext (a TLS Redis may
	// sit beside it), and a tls:// URL to it fails rather than fall back.
	plain := natstest.Start(t).ClientURL()
	require.NoError(t, connect(t, plain, "--client-tls-ca", caFile))
	assert.Error(t, connect(t, strings.Replace(plain, "nats://", "tls://", 1), "--client-tls-ca", caFile))
}

// A user and password in the NATS URL authenticate; none is refused.
func TestNATSUserInURL(t *testing.T) {
	url := natstest.ServerWith(t, natstest.Options{Username: "allot", Password: "p@ss"}).ClientURL()
	require.NoError(t, connect(t, strings.Replace(url, "://", "://allot:p%40ss@", 1)))
	assert.ErrorIs(t, connect(t, url), nats.ErrAuthorization)
}

func redis(t *testing.T, spec string, args ...string) (transportflags.Redis, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := transportflags.Register(fs, "test")
	require.NoError(t, fs.Parse(args))
	return f.Redis(spec, nil)
}

// --redis takes addresses, or a redis:// or rediss:// URL with a user
// and password (percent-encoded) and one or several addresses.
func TestRedisSpec(t *testing.T) {
	r, err := redis(t, "a:1, b:2")
	require.NoError(t, err)
	assert.Equal(t, transportflags.Redis{Addrs: []string{"a:1", "b:2"}}, r)

	r, err = redis(t, "redis://allot:s%40cret@a:1,b:2/")
	require.NoError(t, err)
	assert.Equal(t, transportflags.Redis{Addrs: []string{"a:1", "b:2"}, Username: "allot", Password: "s@cret"}, r)

	r, err = redis(t, "redis://:pw@a:1")
	require.NoError(t, err)
	assert.Equal(t, "", r.Username)
	assert.Equal(t, "pw", r.Password)
	assert.Nil(t, r.TLS)

	dir := t.TempDir()
	ca := certtest.NewCA(t, "allot test CA")
	caFile := ca.WriteCA(t, dir, "ca")
	r, err = redis(t, "rediss://a:1", "--client-tls-ca", caFile)
	require.NoError(t, err)
	require.NotNil(t, r.TLS, "rediss: TLS")
	assert.NotNil(t, r.TLS.RootCAs, "with the client CA")
	r, err = redis(t, "redis://a:1", "--client-tls-ca", caFile)
	require.NoError(t, err)
	assert.Nil(t, r.TLS, "redis: plaintext whatever the files")

	for spec, msg := range map[string]string{
		"http://a:1":            "want redis:// or rediss://",
		"redis://a:1/2":         "no database",
		"redis://a:1?db=2":      "no database",
		"redis://u@a:1":         "a user needs a password",
		"redis://u:pw@":         "names no HOST:PORT",
		"rediss://a:1?x=secret": "no database",
	} {
		_, err := redis(t, spec)
		require.Error(t, err, spec)
		assert.Contains(t, err.Error(), msg, spec)
	}
	_, err = redis(t, "redis://u:s3cret@a:1/0")
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cret", "errors never repeat the password")
}

// README's "Transport security" table lists exactly these flags.
func TestREADMETransportTable(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	require.NoError(t, err)
	rows, err := cli.FlagTable(readme, "## Transport security")
	require.NoError(t, err)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	transportflags.Register(fs, "test")
	if d := cli.TableDisagreements(fs, rows, false); len(d) > 0 {
		t.Errorf("README's Transport security table and the flags disagree:\n%s", strings.Join(d, "\n"))
	}
}

// A rediss:// URL with an ACL user and the --client-tls-* files reaches a
// Redis that requires TLS, client certificates and that user, as the node
// and coordinator open it (package region).
func TestRedisURLReachesSecureRedis(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "allot test CA")
	caFile := ca.WriteCA(t, dir, "ca")
	srvCert, srvKey := ca.Server(t).Write(t, dir, "redis")
	cliCert, cliKey := ca.Client(t, "allot-node").Write(t, dir, "client")
	srv := redistest.ServerWith(t, redistest.Options{
		TLS:   &redistest.TLS{CertFile: srvCert, KeyFile: srvKey, CAFile: caFile},
		Users: map[string]string{"allot": "s3cret"},
	})
	files := []string{"--client-tls-ca", caFile, "--client-tls-cert", cliCert, "--client-tls-key", cliKey}
	open := func(spec string, args ...string) (string, error) {
		t.Helper()
		r, err := redis(t, spec, args...)
		require.NoError(t, err)
		ctx := context.Background()
		st, err := region.Open(ctx, r.Addrs, region.Options{Username: r.Username, Password: r.Password, TLSConfig: r.TLS, DialTimeout: 2 * time.Second})
		if err != nil {
			return "", err
		}
		defer st.Close()
		return st.Client().Do(ctx, "ACL", "WHOAMI").Text()
	}
	who, err := open("rediss://allot:s3cret@"+srv.Addr, files...)
	require.NoError(t, err)
	assert.Equal(t, "allot", who)

	_, err = open("redis://allot:s3cret@"+srv.Addr, files...)
	assert.Error(t, err, "plaintext to a TLS port")
	_, err = open("rediss://allot:guess@"+srv.Addr, files...)
	assert.Error(t, err, "wrong password")
	_, err = open("rediss://allot:s3cret@"+srv.Addr, "--client-tls-ca", caFile)
	assert.Error(t, err, "no client certificate")
}
