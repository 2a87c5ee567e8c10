package redistest

import "syscall"

// sysProcAttr makes the kernel kill redis-server if the test binary dies
// without running its cleanups (panic, SIGKILL, timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
