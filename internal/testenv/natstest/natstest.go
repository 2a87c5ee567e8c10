// Package natstest starts an embedded nats-server with JetStream for
// tests: in process, on a random loopback port, with its store in
// t.TempDir(), shut down when the test ends. Server returns only once
// JetStream answers, so callers need no retry loop of their own. The
// servers themselves are internal/natsproc's; this package binds them to
// a testing.TB.
package natstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/allot-dev/allot/internal/testenv/natsproc"
)

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
	s, err := natsproc.StartJetStream(context.Background(), t.TempDir())
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// WaitJetStream polls url until JetStream answers an account-info request,
// failing the test after the ready timeout.
func WaitJetStream(t testing.TB, url string) {
	t.Helper()
	if err := natsproc.WaitJetStream(context.Background(), url); err != nil {
		t.Fatalf("natstest: %v", err)
	}
}
