package policystore_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/policystore"
)

// A FIFO (or device) at the policy path is refused with a clear error;
// reading it blocked the watcher and every admin call for ever.
func TestFileStoreRefusesNonRegularFiles(t *testing.T) {
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
