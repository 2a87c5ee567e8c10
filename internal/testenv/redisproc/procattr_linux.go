package redisproc

import "syscall"

// sysProcAttr makes the kernel kill redis-server if the process that started it dies
// without stopping it (panic, SIGKILL, test timeout).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
