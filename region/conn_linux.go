package region

import (
	"os"
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

// psiCPU reads "some avg10" of /proc/pressure/cpu.
func psiCPU() (float64, bool) {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, false
	}
	return parsePSI(string(b))
}
