//go:build !linux

package redisproc

// prioritise is Linux's SCHED_FIFO (priority_linux.go); elsewhere the
// server keeps its default policy.
func prioritise(int) {}
