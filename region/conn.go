package region

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// progress is the stall rule's evidence about one Redis address: since
// when each connection has waited for a reply to what it last wrote, and
// the bytes the kernel received on it. The kernel receives while this process
// is paused or short of CPU: a slow node never looks like a silent Redis.
type progress struct {
	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

// silentFor is the longest that a connection to the address has waited
// for any byte of reply since it last wrote, among those whose socket has
// received nothing this process has not read (the kernel is asked only
// of waits of at least t).
func (p *progress) silentFor(now time.Time, t time.Duration) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var longest time.Duration
	for c := range p.conns {
		// In the reverse of Read's order: a count of read bytes that
		// includes a reply's comes with its waiting cleared.
		read := c.read.Load()
		received, known := receivedBytes(c.raw)
		since := c.waiting.Load()
		if since == 0 {
			continue
		}
		w := now.Sub(time.Unix(0, since))
		if w <= longest || (w >= t && known && received > read) {
			continue
		}
		longest = w
	}
	return longest
}

// trackedConn is a connection that knows when it last read, and since
// when it has waited for a reply: its last write, unless it read since.
type trackedConn struct {
	net.Conn
	raw      syscall.RawConn // of the socket, nil if it has none
	prog     *progress
	lastRead atomic.Int64  // unix nanoseconds of its last read of bytes
	waiting  atomic.Int64  // unix nanoseconds of its last write if not read since; 0: none
	read     atomic.Uint64 // bytes read, as the kernel counts them received
	once     sync.Once
}

func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		// The last write: a request sent in several writes (a large
		// pipeline, a node descheduled between them) is whole only then.
		c.waiting.Store(time.Now().UnixNano())
	}
	return n, err
}

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastRead.Store(time.Now().UnixNano())
		c.waiting.Store(0) // before read: see silentFor
		c.read.Add(uint64(n))
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
