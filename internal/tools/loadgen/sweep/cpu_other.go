//go:build !linux

package sweep

import (
	"errors"
	"time"
)

// processCPU needs /proc: the ratio's CPU figures are Linux-only.
func processCPU(int) (time.Duration, error) {
	return 0, errors.New("process CPU time is read from /proc (Linux only)")
}

// loadAverage is unknown without /proc.
func loadAverage() float64 { return 0 }

// machineCPU needs /proc too.
func machineCPU() (cpuTimes, error) {
	return cpuTimes{}, errors.New("machine CPU time is read from /proc (Linux only)")
}

// processSyscalls needs /proc.
func processSyscalls(int) (int64, error) {
	return 0, errors.New("system calls are read from /proc (Linux only)")
}
