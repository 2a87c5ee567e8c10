//go:build !linux

package sweep

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; Run's deferred stops
// and the signal handler of cmd/allot-load are all there is.
func sysProcAttr() *syscall.SysProcAttr { return nil }
