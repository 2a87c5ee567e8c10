package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/admin"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// The coordinator serves the admin API over a store and stops cleanly on
// SIGTERM.
func TestServesAdminAPIAndStopsOnSIGTERM(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	addr, metrics := freeAddr(t), freeAddr(t)
	done := make(chan error, 1)
	go func() {
		done <- run([]string{"--store", path, "--admin-addr", addr, "--admin-token", "T", "--log-level", "error", "--metrics-addr", metrics})
	}()

	c := admin.NewClient("http://"+addr, "T", nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.List(context.Background()); err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "admin API did not come up")
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	// The metrics listener is up before the admin API.
	resp, err := http.Get("http://" + metrics + "/metrics")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("coordinator did not stop on SIGTERM")
	}
}

func TestRefusesUnsafeOrEmptyConfig(t *testing.T) {
	assert.ErrorContains(t, run([]string{"--admin-addr", "127.0.0.1:0"}), "no policy store")
	assert.ErrorContains(t, run([]string{"--store", "memory:", "--admin-addr", "0.0.0.0:0"}), "needs a token")
	assert.ErrorContains(t, run([]string{"--store", "memory:", "--policies", "x"}), "--store and --policies both given")
	assert.ErrorContains(t, run([]string{"--policies", "/nonexistent/p.yaml"}), "/nonexistent/p.yaml", "--policies is --store file:PATH")
	assert.ErrorContains(t, run([]string{"--store", "/nonexistent/p.yaml"}), "/nonexistent/p.yaml", "a path is a policy file")
}
