package node_test

import (
	"context"
	"crypto/tls"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/node/nodetest"
	"github.com/allot-dev/allot/internal/testenv/certtest"
	"github.com/allot-dev/allot/internal/tlsconfig"
	"github.com/allot-dev/allot/middleware"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// tlsFixture is a CA with a server and a client certificate on disk.
type tlsFixture struct {
	dir                   string
	ca                    *certtest.CA
	caFile                string
	certFile, keyFile     string
	clientCert, clientKey string
	server                *certtest.Pair
}

func newTLSFixture(t *testing.T) *tlsFixture {
	t.Helper()
	f := &tlsFixture{dir: t.TempDir(), ca: certtest.NewCA(t, "allot test CA")}
	f.caFile = f.ca.WriteCA(t, f.dir, "ca")
	f.server = f.ca.Server(t)
	f.certFile, f.keyFile = f.server.Write(t, f.dir, "server")
	f.clientCert, f.clientKey = f.ca.Client(t, "allot-client").Write(t, f.dir, "client")
	return f
}

// client is a client config trusting the CA, with the client
// certificate when withCert.
func (f *tlsFixture) client(t *testing.T, withCert bool) *tls.Config {
	t.Helper()
	o := tlsconfig.ClientOptions{CAFile: f.caFile}
	if withCert {
		o.CertFile, o.KeyFile = f.clientCert, f.clientKey
	}
	c, err := tlsconfig.NewClient(o)
	require.NoError(t, err)
	return c
}

// startTLSNode starts a node with every listener (gRPC, HTTP, proxy,
// admin) over TLS; with mtls they all require client certificates.
func startTLSNode(t *testing.T, f *tlsFixture, mtls bool) *node.Node {
	t.Helper()
	opts := tlsconfig.ServerOptions{CertFile: f.certFile, KeyFile: f.keyFile, CheckInterval: time.Nanosecond}
	if mtls {
		opts.ClientCAFile = f.caFile
	}
	srv, err := tlsconfig.NewServer(opts)
	require.NoError(t, err)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("upstream")) }))
	t.Cleanup(upstream.Close)
	path := nodetest.PolicyFile(t, testPolicies)
	n, err := node.Start(context.Background(), node.Config{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0", StoreURL: "file:" + path,
		Upstream: upstream.URL, ProxyAddr: "127.0.0.1:0", CheckTimeout: 30 * time.Second,
		Identity:  middleware.Identity{TenantHeader: "X-Tenant"},
		Transport: node.Transport{TLS: srv},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, n.Close(5*time.Second)) })
	return n
}

// grpcCheck makes one check on a new connection and returns the serial
// of the certificate the node presented.
func grpcCheck(t *testing.T, addr string, cfg *tls.Config) (*big.Int, error) {
	t.Helper()
	conn, err := middleware.Dial(addr, cfg)
	require.NoError(t, err)
	defer conn.Close()
	var p peer.Peer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = ratelimitv1.NewRateLimiterServiceClient(conn).CheckRateLimit(ctx,
		&ratelimitv1.RateLimitRequest{TenantId: "org_acme", Route: "/tls"}, grpc.Peer(&p))
	if err != nil {
		return nil, err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	require.True(t, ok, "the call went over TLS")
	return info.State.PeerCertificates[0].SerialNumber, nil
}

func httpsClient(cfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}}
}

func TestTLSListeners(t *testing.T) {
	f := newTLSFixture(t)
	n := startTLSNode(t, f, false)

	serial, err := grpcCheck(t, n.Addr(), f.client(t, false))
	require.NoError(t, err)
	assert.Equal(t, f.server.Cert.SerialNumber, serial)
	_, err = grpcCheck(t, n.Addr(), nil)
	assert.Error(t, err, "a plaintext client is refused")

	hc := httpsClient(f.client(t, false))
	resp, err := hc.Post("https://"+n.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(`{"tenant_id":"org_acme","route":"/tls"}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2, resp.ProtoMajor, "HTTP/2 is negotiated over TLS")
	assert.NotEmpty(t, resp.Header.Get("X-RateLimit-Limit"))

	// Plain HTTP on the TLS port is never served (Go answers 400 to it).
	resp, err = http.Post("http://"+n.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(`{"tenant_id":"org_acme"}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	resp, err = hc.Get("https://" + n.AdminAddr() + "/v1/policies")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	req, _ := http.NewRequest(http.MethodGet, "https://"+n.ProxyAddr()+"/anything", nil)
	req.Header.Set("X-Tenant", "org_acme")
	resp, err = hc.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestMutualTLSListenersAndReload(t *testing.T) {
	f := newTLSFixture(t)
	n := startTLSNode(t, f, true)

	_, err := grpcCheck(t, n.Addr(), f.client(t, false))
	assert.Error(t, err, "gRPC: a client without a certificate is refused")
	serial, err := grpcCheck(t, n.Addr(), f.client(t, true))
	require.NoError(t, err, "gRPC: a client with a certificate from the CA is served")
	assert.Equal(t, f.server.Cert.SerialNumber, serial)

	// Another CA's client certificate is refused too.
	other := certtest.NewCA(t, "other CA")
	bad := f.client(t, false)
	bad.GetClientCertificate = nil
	bad.Certificates = []tls.Certificate{other.Client(t, "mallory").TLS(t)}
	_, err = grpcCheck(t, n.Addr(), bad)
	assert.Error(t, err)

	for name, url := range map[string]string{
		"http":  "https://" + n.HTTPAddr() + "/healthz",
		"admin": "https://" + n.AdminAddr() + "/v1/policies",
		"proxy": "https://" + n.ProxyAddr() + "/x",
	} {
		_, err := httpsClient(f.client(t, false)).Get(url)
		assert.Error(t, err, "%s: a client without a certificate is refused", name)
		resp, err := httpsClient(f.client(t, true)).Get(url)
		if assert.NoError(t, err, name) {
			resp.Body.Close()
			assert.NotEqual(t, 0, resp.StatusCode)
		}
	}

	// The middleware checks with the node over mTLS.
	conn, err := middleware.Dial(n.Addr(), f.client(t, true))
	require.NoError(t, err)
	defer conn.Close()
	lim, err := middleware.New(middleware.Options{
		Check:    middleware.FromClient(ratelimitv1.NewRateLimiterServiceClient(conn)),
		Identity: middleware.Identity{TenantHeader: "X-Tenant"}, Timeout: 10 * time.Second,
	})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/v1/things", nil)
	r.Header.Set("X-Tenant", "org_acme")
	lim.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })).ServeHTTP(rec, r)
	assert.Equal(t, http.StatusNoContent, rec.Code)
	assert.Empty(t, rec.Header().Get("X-RateLimit-Status"), "decided by the node, not failed open")
	assert.Equal(t, "100", rec.Header().Get("X-RateLimit-Limit"))

	// Rotate the server certificate and the client CA without a restart:
	// new connections see the new serial; the old CA's clients are refused.
	ca2 := certtest.NewCA(t, "rotated CA")
	next := ca2.Server(t)
	certtest.WriteFile(t, f.caFile, append(append([]byte{}, f.ca.PEM...), ca2.PEM...)) // clients trust both during the rotation
	next.Write(t, f.dir, "server")
	serial, err = grpcCheck(t, n.Addr(), f.client(t, true))
	require.NoError(t, err)
	assert.Equal(t, next.Cert.SerialNumber, serial, "a new connection sees the new certificate")
	resp, err := httpsClient(f.client(t, true)).Get("https://" + n.HTTPAddr() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, next.Cert.SerialNumber, resp.TLS.PeerCertificates[0].SerialNumber)

	certtest.WriteFile(t, f.caFile, ca2.PEM) // now only ca2's clients are accepted
	_, err = grpcCheck(t, n.Addr(), f.client(t, true))
	assert.Error(t, err, "a client of the retired CA is refused after the client CA reload")
	f.clientCert, f.clientKey = ca2.Client(t, "allot-client-2").Write(t, f.dir, "client")
	_, err = grpcCheck(t, n.Addr(), f.client(t, true))
	assert.NoError(t, err)
}
