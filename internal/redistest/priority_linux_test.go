package redistest

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// As root, a test server's main thread runs under SCHED_FIFO, before and
// after a restart (prioritise).
func TestServerRunsAheadOfTheTests(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SCHED_FIFO needs root")
	}
	in := Server(t)
	attr, err := unix.SchedGetAttr(in.srv.Pid(), 0)
	require.NoError(t, err)
	assert.Equal(t, uint32(unix.SCHED_FIFO), attr.Policy)
	in.Restart()
	attr, err = unix.SchedGetAttr(in.srv.Pid(), 0)
	require.NoError(t, err)
	assert.Equal(t, uint32(unix.SCHED_FIFO), attr.Policy, "after a restart")
}
