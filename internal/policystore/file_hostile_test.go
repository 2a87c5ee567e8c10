package policystore_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/policystore"
)

// A FIFO (or device) at the policy path is refused with a clear error;
// reading it blocked the watcher and every admin call for ever.
func TestFileSourceRefusesNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	_, err := policystore.Open(context.Background(), "file:"+fifo, policystore.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a regular file")

	// A regular file replaced by a FIFO after Open: Load answers, it does
	// not block.
	path := filepath.Join(dir, "p.yaml")
	require.NoError(t, os.WriteFile(path, []byte(handWritten), 0o600))
	s, err := policystore.Open(context.Background(), "file:"+path, policystore.Options{})
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	done := make(chan error, 1)
	go func() { _, _, err := s.Load(context.Background()); done <- err }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not a regular file")
	case <-time.After(10 * time.Second):
		// Unblock the reader so the test ends, then fail.
		if f, err := os.OpenFile(path, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		t.Fatal("Load blocked on a FIFO")
	}
}

const twoPolicies = `
policies:
  - id: api
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s}
  - id: login
    per: [client]
    on_store_failure: closed
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1, period: 1s}
`

// A writer that pauses mid-file, at a policy boundary, must not have its
// prefix applied (the fail-closed login limit vanished for 2 s); the file
// is applied once the writer closes it, and a rename applies at once.
func TestWatchWaitsForTheWriterToClose(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("close-after-write needs inotify")
	}
	path := filepath.Join(t.TempDir(), "p.yaml")
	require.NoError(t, os.WriteFile(path, []byte(twoPolicies), 0o600))
	const poll = 20 * time.Millisecond
	s, err := policystore.OpenFile(path, policystore.Options{PollInterval: poll})
	require.NoError(t, err)
	snaps := make(chan policystore.Snapshot, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Watch(ctx, func(sn policystore.Snapshot) { snaps <- sn }) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Len(t, (<-snaps).File.Policies, 2)

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	require.NoError(t, err)
	cut := strings.Index(twoPolicies, "  - id: login")
	_, err = f.WriteString(twoPolicies[:cut] + "  - id: extra\n    per: [tenant]\n    limits:\n      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s}\n")
	require.NoError(t, err)
	// The prefix is a valid set; it must not be delivered while the writer
	// holds the file open (25 polls: far past the one-poll debounce).
	select {
	case sn := <-snaps:
		t.Fatalf("a half-written file was applied: %d policies", len(sn.File.Policies))
	case <-time.After(25 * poll):
	}
	_, err = f.WriteString(twoPolicies[cut:])
	require.NoError(t, err)
	require.NoError(t, f.Close())
	select {
	case sn := <-snaps:
		assert.Len(t, sn.File.Policies, 3, "applied once closed")
	case <-time.After(10 * time.Second):
		t.Fatal("the closed file was not applied")
	}

	// Replace by rename: complete by construction, applied without a close
	// on the watched inode.
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(twoPolicies), 0o600))
	require.NoError(t, os.Rename(tmp, path))
	select {
	case sn := <-snaps:
		assert.Len(t, sn.File.Policies, 2)
	case <-time.After(10 * time.Second):
		t.Fatal("the renamed file was not applied")
	}
}
