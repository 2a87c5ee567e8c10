package region

import (
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// unreadBytes is how many received bytes wait in the socket's buffer
// (FIONREAD); it does not disturb a goroutine blocked reading it.
func unreadBytes(raw syscall.RawConn) int {
	n := 0
	_ = raw.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil {
			n = v
		}
	})
	return n
}

// psiFile reads /proc/pressure/cpu through one descriptor, opened on
// first use: a pread of it is a couple of microseconds and allocates
// nothing, where opening it again each time costs five times that.
type psiFile struct {
	mu     sync.Mutex
	f      *os.File
	bad    bool // the file could not be opened: PSI is not available
	closed bool // by close: a check still running reads nothing
	buf    [512]byte
}

// read parses the "some" line; false where PSI is not available.
func (p *psiFile) read() (psi, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.f == nil && !p.bad && !p.closed {
		f, err := os.Open("/proc/pressure/cpu")
		if err != nil {
			p.bad = true
			return psi{}, false
		}
		p.f = f
	}
	if p.f == nil {
		return psi{}, false
	}
	n, err := p.f.ReadAt(p.buf[:], 0)
	if n == 0 && err != nil {
		return psi{}, false
	}
	return parsePSI(string(p.buf[:n]))
}

// close releases the descriptor; reads after it report nothing.
func (p *psiFile) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.f != nil {
		_ = p.f.Close()
		p.f = nil
	}
}
