package sweep

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// processCPU is the user plus system CPU time process pid has used.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("cpu of process %d: %w", pid, err)
	}
	return parseStatCPU(string(b))
}

// loadAverage is the 1-minute load average (0 if unreadable).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	return parseLoadAverage(string(b))
}

// machineCPU is the machine's CPU time by class so far.
func machineCPU() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, fmt.Errorf("machine cpu: %w", err)
	}
	return parseProcStat(string(b))
}

// processSyscalls is the read and write system calls process pid has
// made (/proc/PID/io: readable for one's own processes).
func processSyscalls(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, fmt.Errorf("system calls of process %d: %w", pid, err)
	}
	return parseIOSyscalls(string(b))
}
