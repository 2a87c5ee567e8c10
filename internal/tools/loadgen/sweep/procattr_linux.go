package sweep

import "syscall"

// sysProcAttr makes the kernel kill a child the sweep started if the
// sweep dies without stopping it (panic, SIGKILL, test timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
