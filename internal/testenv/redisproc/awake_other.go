//go:build !linux

package redisproc

// keepAwake is Linux's busy loop under SCHED_IDLE (awake_linux.go).
func keepAwake(int) (stop func(), err error) { return nil, errNoAffinity }
