//go:build !linux

package redistest

import "syscall"

// sysProcAttr has no parent-death signal outside Linux; t.Cleanup still
// kills the process on a normal test exit.
func sysProcAttr() *syscall.SysProcAttr { return nil }
