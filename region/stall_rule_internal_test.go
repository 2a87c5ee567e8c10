package region

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trackedPair is a connection dialled through the store's tracking, and
// the server's end of it, on loopback.
func trackedPair(t *testing.T) (*progress, net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() { // owned: ends with the one accept
		c, _ := ln.Accept()
		accepted <- c
	}()
	cs := &conns{}
	c, err := cs.dialer(Options{DialTimeout: time.Second})(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	srv := <-accepted
	require.NotNil(t, srv)
	t.Cleanup(func() { _ = c.Close(); _ = srv.Close() })
	return cs.of(ln.Addr().String()), c, srv
}

// The stall rule's evidence, step by step on a real socket. A rule that
// counted from when a pipeline was queued, or that ignored bytes the
// kernel holds for a process that did not read them (a paused node),
// fails the "node's own delay" steps; one that missed a silent server
// fails the "frozen" step.
func TestStallEvidence(t *testing.T) {
	const T = 4 * time.Millisecond
	prog, c, srv := trackedPair(t)
	later := func(d time.Duration) time.Time { return time.Now().Add(d) }

	assert.Zero(t, prog.silentFor(later(time.Hour), T), "node's own delay: nothing written yet, nothing waited for")

	_, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n"))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, prog.silentFor(later(time.Second), T), time.Second-time.Millisecond, "frozen: written, no reply since")

	_, err = srv.Write([]byte("+PONG\r\n"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return prog.silentFor(later(time.Second), T) == 0 }, time.Second, time.Millisecond,
		"node's own delay: the reply waits unread in the socket, this process did not read it")

	buf := make([]byte, 16)
	n, err := c.Read(buf)
	require.NoError(t, err)
	assert.Equal(t, "+PONG\r\n", string(buf[:n]))
	assert.Zero(t, prog.silentFor(later(time.Hour), T), "answered: no connection waits")

	_, err = c.Write([]byte("*1\r\n$4\r\nPING\r\n"))
	require.NoError(t, err)
	assert.Less(t, prog.silentFor(time.Now(), T), T, "a wait shorter than T is not yet silence")
	require.NoError(t, c.Close())
	assert.Zero(t, prog.silentFor(later(time.Hour), T), "a closed connection waits for nothing")
}
