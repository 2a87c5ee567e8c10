package client_test

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/testenv/certtest"
	"github.com/allot-dev/allot/internal/tlsconfig"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// TLS and mTLS through WithTLS, with configs from package tlsconfig.
func TestTLSAndMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "allot client test CA")
	certFile, keyFile := ca.Server(t).Write(t, dir, "server")
	caFile := ca.WriteCA(t, dir, "ca")
	clientCert, clientKey := ca.Client(t, "svc").Write(t, dir, "client")
	path := filepath.Join(dir, "p.yaml")
	require.NoError(t, os.WriteFile(path, []byte(policies), 0o600))

	start := func(mtls bool) *node.Node {
		opts := tlsconfig.ServerOptions{CertFile: certFile, KeyFile: keyFile}
		if mtls {
			opts.ClientCAFile = caFile
		}
		srv, err := tlsconfig.NewServer(opts)
		require.NoError(t, err)
		n, err := node.Start(context.Background(), node.Config{GRPCAddr: "127.0.0.1:0", PoliciesPath: path, Transport: node.Transport{TLS: srv}})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
		return n
	}
	check := func(n *node.Node, cfg *tls.Config) error {
		c, err := client.New([]string{n.Addr()}, client.WithTLS(cfg))
		require.NoError(t, err)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), patient)
		defer cancel()
		resp, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{TenantId: "big", ClientIdentifier: "tls"})
		if err == nil {
			assert.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, resp.Decision)
		}
		return err
	}
	plainTLS, err := tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: caFile})
	require.NoError(t, err)
	withCert, err := tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: caFile, CertFile: clientCert, KeyFile: clientKey})
	require.NoError(t, err)

	tlsNode := start(false)
	assert.NoError(t, check(tlsNode, plainTLS), "TLS")

	mtlsNode := start(true)
	assert.NoError(t, check(mtlsNode, withCert), "mTLS")
	err = check(mtlsNode, plainTLS)
	assert.Equal(t, codes.Unavailable, status.Code(err), "mTLS node without a client certificate: %v", err)
}
