package policystore

import (
	"errors"
	"syscall"
	"unsafe"
)

// closeWatch tells the file watcher when a writer closed the policy file
// (inotify IN_CLOSE_WRITE on the file's inode; a symlink is followed), so
// that a file changed in place is applied only once it is complete.
type closeWatch struct {
	fd, wd int
	buf    [4096]byte
}

// newCloseWatch returns nil when inotify is not available; the watcher
// then falls back to "stable for one poll interval".
func newCloseWatch(path string) *closeWatch {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	c := &closeWatch{fd: fd, wd: -1}
	if !c.rewatch(path) {
		syscall.Close(fd)
		return nil
	}
	return c
}

// rewatch moves the watch to the inode now at path (after a rename or a
// symlink swap replaced the file).
func (c *closeWatch) rewatch(path string) bool {
	wd, err := syscall.InotifyAddWatch(c.fd, path, syscall.IN_CLOSE_WRITE)
	if err != nil {
		return false
	}
	if c.wd >= 0 && c.wd != wd {
		_, _ = syscall.InotifyRmWatch(c.fd, uint32(c.wd))
	}
	c.wd = wd
	return true
}

// closed drains the queued events and reports whether the watched file
// was closed after a write since the last call.
func (c *closeWatch) closed() bool {
	seen := false
	for {
		n, err := syscall.Read(c.fd, c.buf[:])
		if err != nil || n <= 0 {
			if err != nil && !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EINTR) {
				return true // cannot tell any more: do not block applying
			}
			return seen
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			ev := (*syscall.InotifyEvent)(unsafe.Pointer(&c.buf[off]))
			if int(ev.Wd) == c.wd && ev.Mask&syscall.IN_CLOSE_WRITE != 0 {
				seen = true
			}
			off += syscall.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

func (c *closeWatch) close() { syscall.Close(c.fd) }
