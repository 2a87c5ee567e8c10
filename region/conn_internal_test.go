package region

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/testenv/redistest"
)

// go-redis's health check (a peek at the socket through SyscallConn's
// Read) is skipped for a connection that read bytes within freshReadFor,
// and runs for one that has not (or never read).
func TestHealthCheckSkippedOnAFreshConnection(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	tc := &trackedConn{Conn: a, raw: fakeRaw{}, prog: &progress{conns: map[*trackedConn]struct{}{}}}
	raw, err := newTrackedSysConn(tc).SyscallConn()
	require.NoError(t, err)
	peeks := 0
	peek := func(uintptr) bool { peeks++; return true }

	require.NoError(t, raw.Read(peek))
	assert.Equal(t, 1, peeks, "a connection that never read is checked")

	tc.lastRead.Store(time.Now().UnixNano())
	require.NoError(t, raw.Read(peek))
	assert.Equal(t, 1, peeks, "a connection that read a reply just now is not")

	tc.lastRead.Store(time.Now().Add(-freshReadFor).UnixNano())
	require.NoError(t, raw.Read(peek))
	assert.Equal(t, 2, peeks, "a connection idle for freshReadFor is checked again")
}

// fakeRaw runs f at once, as a socket with nothing to wait for would.
type fakeRaw struct{}

func (fakeRaw) Control(f func(uintptr)) error    { f(0); return nil }
func (fakeRaw) Read(f func(uintptr) bool) error  { f(0); return nil }
func (fakeRaw) Write(f func(uintptr) bool) error { f(0); return nil }

var _ syscall.RawConn = fakeRaw{}

// What the health check is for still holds: the pooled connections of a
// Redis that was restarted are found closed and replaced when next taken
// from the pool, so the first call after the restart succeeds instead of
// failing on a dead connection.
func TestPooledConnectionsOfARestartedRedisAreReplaced(t *testing.T) {
	redistest.Require(t)
	in := redistest.Server(t)
	s, err := Open(context.Background(), []string{in.Addr}, Options{Timeout: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	g := []algorithm.Group{{{Key: "rl:{pool}:x", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Hour}, Cost: 1}}}
	_, err = s.Take(context.Background(), g)
	require.NoError(t, err)
	read := time.Now()

	in.Kill()
	in.Restart()
	// The pooled connection must have been idle for freshReadFor, or the
	// check is skipped by design; a fast restart can take less than that.
	if idle := time.Since(read); idle < freshReadFor {
		time.Sleep(freshReadFor - idle)
	}
	_, err = s.Take(context.Background(), g)
	require.NoError(t, err, "the first call after the restart")
	assert.Equal(t, BreakerClosed, s.Shards()[0].State)
}
