package natstest

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure a server that demands credentials and TLS.
type Options struct {
	// TLS, when set, is the server's TLS config: clients must speak TLS.
	// Set ClientAuth and ClientCAs in it to require client certificates.
	TLS *tls.Config
	// Username and Password, when set, are the only credentials accepted.
	Username, Password string
}

// ServerWith starts a JetStream-enabled nats-server configured by o and
// returns it once it accepts connections. It is shut down when the test
// ends.
func ServerWith(t testing.TB, o Options) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
		Username:  o.Username,
		Password:  o.Password,
	}
	if o.TLS != nil {
		opts.TLS = true
		opts.TLSConfig = o.TLS
		opts.TLSVerify = o.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		opts.TLSTimeout = 5 // seconds; the default 0.5 s is tight under -race
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	s.Start() // does not block; its goroutines end with Shutdown
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(15 * time.Second) {
		t.Fatalf("natstest: server not ready")
	}
	return s
}
