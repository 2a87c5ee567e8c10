package sweep

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/PID/stat line. The command name (field 2) is in parentheses and
// may hold spaces and parentheses itself, so fields are counted from the
// last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat line without a command name: %.40q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat line with %d fields after the name, want >= 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("/proc stat CPU field %q: want a count of ticks", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// cpuTimes is the machine's CPU time by class, in ticks, from the first
// line of /proc/stat.
type cpuTimes struct{ total, idle, steal int64 }

// parseProcStat reads the "cpu" line of /proc/stat: user nice system idle
// iowait irq softirq steal (guest time is already inside user). Idle
// counts iowait too: a CPU waiting for a disk could run the load.
func parseProcStat(s string) (cpuTimes, error) {
	line, _, _ := strings.Cut(s, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("/proc/stat without a cpu line of 8 fields: %.40q", line)
	}
	var v [8]int64
	for i := range v {
		n, err := strconv.ParseInt(f[1+i], 10, 64)
		if err != nil || n < 0 {
			return cpuTimes{}, fmt.Errorf("/proc/stat field %q: want a count of ticks", f[1+i])
		}
		v[i] = n
	}
	var t cpuTimes
	for _, n := range v {
		t.total += n
	}
	t.idle, t.steal = v[3]+v[4], v[7]
	return t, nil
}

// share is the idle and stolen fractions of the machine's CPU time
// between a and b (zero when no time passed, or either is unknown).
func (a cpuTimes) share(b cpuTimes) (idle, steal float64) {
	d := b.total - a.total
	if a.total == 0 || d <= 0 {
		return 0, 0
	}
	return float64(b.idle-a.idle) / float64(d), float64(b.steal-a.steal) / float64(d)
}

// parseLoadAverage is the first field of /proc/loadavg (0 if malformed).
func parseLoadAverage(s string) float64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return v
}

// parseIOSyscalls is the read and write system calls counted in a
// /proc/PID/io file (its syscr and syscw lines), summed over the
// process's threads.
func parseIOSyscalls(s string) (int64, error) {
	var n int64
	found := 0
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "syscr" && k != "syscw") {
			continue
		}
		c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || c < 0 {
			return 0, fmt.Errorf("/proc io %s %q: want a count", k, v)
		}
		n += c
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("/proc io without syscr and syscw: %.60q", s)
	}
	return n, nil
}
