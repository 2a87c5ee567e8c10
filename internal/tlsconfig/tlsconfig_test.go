package tlsconfig_test

import (
	"crypto/tls"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/certtest"
	"github.com/allot-dev/allot/internal/tlsconfig"
)

// serve accepts connections on a TLS listener and completes each
// handshake, until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake() // a refused client is not our error
			c.Close()
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return lis.Addr().String()
}

func dial(addr string, cfg *tls.Config) (*tls.ConnectionState, error) {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// TLS 1.3 reports a refused client certificate on the first read.
	if _, err := c.Read(make([]byte, 1)); err != nil && !isEOF(err) {
		return nil, err
	}
	st := c.ConnectionState()
	return &st, nil
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

func TestServerReloadsReplacedCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "test CA")
	first := ca.Server(t)
	certFile, keyFile := first.Write(t, dir, "server")
	// A tiny interval: the next handshake checks the files.
	srv, err := tlsconfig.NewServer(tlsconfig.ServerOptions{CertFile: certFile, KeyFile: keyFile, CheckInterval: 1})
	require.NoError(t, err)
	addr := serve(t, srv.Config())
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}

	st, err := dial(addr, client)
	require.NoError(t, err)
	assert.Equal(t, first.Cert.SerialNumber, st.PeerCertificates[0].SerialNumber)

	second := ca.Server(t)
	second.Write(t, dir, "server")
	st, err = dial(addr, client)
	require.NoError(t, err)
	assert.Equal(t, second.Cert.SerialNumber, st.PeerCertificates[0].SerialNumber, "a new connection sees the new certificate")

	// A broken replacement keeps the last good certificate in service.
	certtest.WriteFile(t, certFile, []byte("not a certificate"))
	st, err = dial(addr, client)
	require.NoError(t, err)
	assert.Equal(t, second.Cert.SerialNumber, st.PeerCertificates[0].SerialNumber)
	assert.Error(t, srv.Reload())
}

func TestServerMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "test CA")
	certFile, keyFile := ca.Server(t).Write(t, dir, "server")
	srv, err := tlsconfig.NewServer(tlsconfig.ServerOptions{CertFile: certFile, KeyFile: keyFile, ClientCAFile: ca.WriteCA(t, dir, "ca")})
	require.NoError(t, err)
	assert.True(t, srv.MutualTLS())
	addr := serve(t, srv.Config())

	_, err = dial(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"})
	assert.Error(t, err, "a client without a certificate is refused")

	other := certtest.NewCA(t, "other CA")
	_, err = dial(addr, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", Certificates: []tls.Certificate{other.Client(t, "mallory").TLS(t)}})
	assert.Error(t, err, "a certificate from another CA is refused")

	cc, ck := ca.Client(t, "alice").Write(t, dir, "client")
	client, err := tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: ca.WriteCA(t, dir, "ca"), CertFile: cc, KeyFile: ck})
	require.NoError(t, err)
	st, err := dial(addr, client)
	require.NoError(t, err)
	assert.Equal(t, "localhost", st.PeerCertificates[0].Subject.CommonName)
}

func TestBadFilesFailAtStart(t *testing.T) {
	dir := t.TempDir()
	_, err := tlsconfig.NewServer(tlsconfig.ServerOptions{CertFile: dir + "/missing.crt", KeyFile: dir + "/missing.key"})
	assert.Error(t, err)
	_, err = tlsconfig.NewServer(tlsconfig.ServerOptions{CertFile: "x"})
	assert.Error(t, err)
	_, err = tlsconfig.NewClient(tlsconfig.ClientOptions{CertFile: "x"})
	assert.Error(t, err)
	bad := dir + "/bad.pem"
	certtest.WriteFile(t, bad, []byte("nope"))
	_, err = tlsconfig.NewClient(tlsconfig.ClientOptions{CAFile: bad})
	assert.Error(t, err)
}
