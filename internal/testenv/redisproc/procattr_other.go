//go:build !linux

package redisproc

import "syscall"

// sysProcAttr has no parent-death signal outside Linux; Stop still
// kills the process on a normal exit.
func sysProcAttr() *syscall.SysProcAttr { return nil }
