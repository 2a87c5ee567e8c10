package region

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// progress is what this node has received from one Redis address, across
// all its connections: when bytes last arrived, and the connections, to
// ask the kernel whether received bytes wait unread. It lets the stall
// judgement tell a shard that stopped answering from a node too busy to
// read the answers (shard.check).
type progress struct {
	lastRead atomic.Int64 // unix nanoseconds
	mu       sync.Mutex
	conns    map[*trackedConn]struct{}
}

// pending reports whether some connection to the address has received
// bytes this process has not read yet.
func (p *progress) pending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.raw != nil && unreadBytes(c.raw) > 0 {
			return true
		}
	}
	return false
}

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
			out = &trackedSysConn{t}
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

// trackedConn is a connection whose reads mark its address's progress.
type trackedConn struct {
	net.Conn
	raw      syscall.RawConn // of the socket, nil if it has none
	prog     *progress
	lastRead atomic.Int64 // unix nanoseconds of this connection's last read of bytes
	once     sync.Once
}

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		now := time.Now().UnixNano()
		c.prog.lastRead.Store(now)
		c.lastRead.Store(now)
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.prog.mu.Lock()
		delete(c.prog.conns, c)
		c.prog.mu.Unlock()
	})
	return c.Conn.Close()
}

// trackedSysConn also exposes the socket, so that go-redis's health check
// of pooled connections (a non-blocking peek) keeps working.
type trackedSysConn struct{ *trackedConn }

func (c *trackedSysConn) SyscallConn() (syscall.RawConn, error) {
	return checkedRaw{RawConn: c.raw, c: c.trackedConn}, nil
}

// freshReadFor is how recently a connection must have read a reply for
// go-redis's health check of it to be skipped. go-redis peeks every
// connection it takes from the pool (a recvfrom with MSG_PEEK), which
// under load is one system call per pipeline, a third of a round trip's
// (docs/benchmarks.md). The peek finds a connection the server closed
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

func (r checkedRaw) Read(f func(fd uintptr) (done bool)) error {
	if last := r.c.lastRead.Load(); last != 0 && time.Now().UnixNano()-last < int64(freshReadFor) {
		return nil
	}
	return r.RawConn.Read(f)
}

// psi is the "some" line of a PSI file: avg10, the percentage of the last
// 10 s in which some runnable task waited for a CPU, and total, the
// cumulative time it did.
type psi struct {
	avg10 float64
	total time.Duration
}

// cpuTimes is the machine's cumulative CPU time from /proc/stat's "cpu"
// line, in the file's clock ticks (USER_HZ, 10 ms on Linux; only ratios
// of them are used): steal, the time the hypervisor ran something else
// while a CPU of this machine had work, and all, the sum of the line's
// first eight fields (user to steal; guest time is inside user).
type cpuTimes struct {
	steal, all int64
}

// parseStat reads the first "cpu " line of /proc/stat.
func parseStat(s string) (cpuTimes, bool) {
	line, _, _ := strings.Cut(s, "\n")
	rest, ok := strings.CutPrefix(line, "cpu ")
	if !ok {
		return cpuTimes{}, false
	}
	var v cpuTimes
	i := 0
	for f := range strings.FieldsSeq(rest) {
		if i == 8 {
			break
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 0 || v.all > math.MaxInt64-n {
			return cpuTimes{}, false
		}
		v.all += n
		if i == 7 {
			v.steal = n
		}
		i++
	}
	return v, i == 8
}

// parsePSI reads the "some" line of a PSI file (total is in µs there).
func parsePSI(s string) (psi, bool) {
	for line := range strings.SplitSeq(s, "\n") {
		rest, ok := strings.CutPrefix(line, "some ")
		if !ok {
			continue
		}
		var v psi
		var haveAvg, haveTotal bool
		for f := range strings.FieldsSeq(rest) {
			if a, ok := strings.CutPrefix(f, "avg10="); ok {
				x, err := strconv.ParseFloat(a, 64)
				v.avg10, haveAvg = x, err == nil
			} else if t, ok := strings.CutPrefix(f, "total="); ok {
				us, err := strconv.ParseInt(t, 10, 64)
				v.total, haveTotal = time.Duration(us)*time.Microsecond, err == nil && us >= 0
			}
		}
		return v, haveAvg && haveTotal
	}
	return psi{}, false
}
