package region

// Connection set-up: every connection go-redis opens is dialled here and
// wrapped in a trackedConn (conn.go), whose reads and writes are the
// stall rule's evidence.

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
)

// conns tracks the connections of every address a store dials.
type conns struct {
	mu sync.Mutex
	m  map[string]*progress
}

func (cs *conns) of(addr string) *progress {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.m == nil {
		cs.m = map[string]*progress{}
	}
	p := cs.m[addr]
	if p == nil {
		p = &progress{conns: map[*trackedConn]struct{}{}}
		cs.m[addr] = p
	}
	return p
}

// dialer wraps the connections go-redis opens so that reads are seen by
// the address's progress. With no Dialer in opts it dials TCP (and TLS
// over it when opts.TLSConfig is set, as go-redis's own dialer would);
// a given Dialer is used as is (it does its own TLS).
func (cs *conns) dialer(opts Options) func(ctx context.Context, network, addr string) (net.Conn, error) {
	base := opts.Dialer
	var tlsConf *tls.Config
	if base == nil {
		d := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 5 * time.Minute}
		base = d.DialContext
		tlsConf = opts.TLSConfig
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := base(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		prog := cs.of(addr)
		t := &trackedConn{Conn: c, prog: prog}
		if sc, ok := c.(syscall.Conn); ok {
			if raw, err := sc.SyscallConn(); err == nil {
				t.raw = raw
			}
		}
		prog.mu.Lock()
		prog.conns[t] = struct{}{}
		prog.mu.Unlock()
		var out net.Conn = t
		if t.raw != nil {
			out = newTrackedSysConn(t)
		}
		if tlsConf != nil {
			conf := tlsConf.Clone()
			if conf.ServerName == "" {
				host, _, _ := net.SplitHostPort(addr)
				conf.ServerName = host
			}
			tc := tls.Client(out, conf)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = tc.Close()
				return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
			}
			return tc, nil
		}
		return out, nil
	}
}

// trackedSysConn also exposes the socket, so that go-redis's health check
// of pooled connections (a non-blocking peek) keeps working.
// Its RawConn is made once: go-redis asks for it on every connection it
// takes from the pool.
type trackedSysConn struct {
	*trackedConn
	checked *checkedRaw
}

func newTrackedSysConn(t *trackedConn) *trackedSysConn {
	return &trackedSysConn{t, &checkedRaw{RawConn: t.raw, c: t}}
}

func (c *trackedSysConn) SyscallConn() (syscall.RawConn, error) { return c.checked, nil }

// freshReadFor is how recently a connection must have read a reply for
// go-redis's health check of it to be skipped. go-redis peeks every
// connection it takes from the pool (a recvfrom with MSG_PEEK), which
// under load is one system call per pipeline, a third of a round trip's
// (docs/performance.md, "Where an exact check's CPU goes"). The peek finds a connection the server closed
// while it sat in the pool (a restarted Redis); a connection that read a
// reply this recently was in use, not sitting, and a Redis restart takes
// longer than this, so a connection from before a restart is still
// peeked. A connection that breaks in use fails its own pipeline's read,
// with or without the peek.
const freshReadFor = 10 * time.Millisecond

// checkedRaw is the socket as go-redis's health check sees it: its Read
// (the peek) runs only when the connection has not read bytes within
// freshReadFor; everything else is the socket's own.
type checkedRaw struct {
	syscall.RawConn
	c *trackedConn
}

func (r *checkedRaw) Read(f func(fd uintptr) (done bool)) error {
	if last := r.c.lastRead.Load(); last != 0 && time.Now().UnixNano()-last < int64(freshReadFor) {
		return nil
	}
	return r.RawConn.Read(f)
}
