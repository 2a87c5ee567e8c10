package region

import (
	"bytes"
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

// procFile reads one file of /proc through one descriptor, opened on
// first use: a pread of /proc/pressure/cpu or of /proc/stat's head is
// ~4 µs here (BenchmarkProcReads), where opening the file again each
// time costs five times that.
type procFile struct {
	path   string
	mu     sync.Mutex
	f      *os.File
	bad    bool // the file could not be opened: not available here
	closed bool // by close: a check still running reads nothing
	buf    [512]byte
}

// psiFile reads /proc/pressure/cpu.
type psiFile struct{ procFile }

func newPSIFile() *psiFile { return &psiFile{procFile{path: "/proc/pressure/cpu"}} }

// read parses the "some" line; false where PSI is not available.
func (p *psiFile) read() (psi, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.readLocked()
	if !ok {
		return psi{}, false
	}
	return parsePSI(string(b))
}

// statFile reads the machine's CPU times from /proc/stat's first line.
type statFile struct{ procFile }

func newStatFile() *statFile { return &statFile{procFile{path: "/proc/stat"}} }

// read parses the "cpu" line; false where it is not available. Only the
// file's head is read (the buffer): the line comes first.
func (p *statFile) read() (cpuTimes, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.readLocked()
	if !ok {
		return cpuTimes{}, false
	}
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i] // the rest is per CPU, interrupts and counters
	}
	return parseStat(string(b))
}

// readLocked returns the file's head (up to the buffer's size).
func (p *procFile) readLocked() ([]byte, bool) {
	if p.f == nil && !p.bad && !p.closed {
		f, err := os.Open(p.path)
		if err != nil {
			p.bad = true
			return nil, false
		}
		p.f = f
	}
	if p.f == nil {
		return nil, false
	}
	n, err := p.f.ReadAt(p.buf[:], 0)
	if n == 0 && err != nil {
		return nil, false
	}
	return p.buf[:n], true
}

// close releases the descriptor; reads after it report nothing.
func (p *procFile) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.f != nil {
		_ = p.f.Close()
		p.f = nil
	}
}
