package region

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// receivedBytes is how many bytes the socket has received since it
// opened, read or not (TCP_INFO's tcpi_bytes_received); known is false
// where the kernel does not say.
func receivedBytes(raw syscall.RawConn) (n uint64, known bool) {
	if raw == nil {
		return 0, false
	}
	_ = raw.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			n, known = info.Bytes_received, true
		}
	})
	return n, known
}
