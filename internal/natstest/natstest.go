// Package natstest starts an embedded nats-server with JetStream for
// tests: in process, on a random loopback port, with its store in
// t.TempDir(), shut down when the test ends. Server returns only once
// JetStream answers, so callers need no retry loop of their own.
package natstest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyTimeout bounds the wait for the server and for JetStream.
const readyTimeout = 15 * time.Second

// Server starts a JetStream-enabled nats-server and returns its client URL
// (nats://127.0.0.1:PORT).
func Server(t testing.TB) string {
	t.Helper()
	return Start(t).ClientURL()
}

// Start starts a JetStream-enabled nats-server and returns it, for tests
// that stop or restart it. It is shut down when the test ends.
func Start(t testing.TB) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	s.Start() // does not block; the server's goroutines end with Shutdown below
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(readyTimeout) {
		t.Fatalf("natstest: server not ready after %v", readyTimeout)
	}
	WaitJetStream(t, s.ClientURL())
	return s
}

// WaitJetStream polls url until JetStream answers an account-info request,
// failing the test after the ready timeout.
func WaitJetStream(t testing.TB, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: JetStream not ready after %v: %v", readyTimeout, err)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}
