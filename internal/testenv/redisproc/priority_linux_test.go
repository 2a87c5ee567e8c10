package redisproc

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// As root, redis-server's main thread runs under SCHED_FIFO, before and
// after a restart (prioritise).
func TestServerRunsAheadOfTheTests(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SCHED_FIFO needs root")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server")
	}
	srv, err := Start(context.Background(), Options{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Kill() })
	attr, err := unix.SchedGetAttr(srv.Pid(), 0)
	require.NoError(t, err)
	assert.Equal(t, uint32(unix.SCHED_FIFO), attr.Policy)
	require.NoError(t, srv.Restart(context.Background()))
	attr, err = unix.SchedGetAttr(srv.Pid(), 0)
	require.NoError(t, err)
	assert.Equal(t, uint32(unix.SCHED_FIFO), attr.Policy, "after a restart")
}
