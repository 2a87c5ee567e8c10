package redisproc

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// threadCPUs is the CPU sets of this process's threads, deduplicated.
func threadCPUs(t *testing.T) [][]int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]int
	for _, e := range tasks {
		tid, _ := strconv.Atoi(e.Name())
		cpus, err := processCPUs(tid)
		if err != nil {
			continue // the thread ended
		}
		if !slices.ContainsFunc(out, func(c []int) bool { return slices.Equal(c, cpus) }) {
			out = append(out, cpus)
		}
	}
	return out
}

// idleChildren is the processes this one started that run under
// SCHED_IDLE, with their CPUs.
func idleChildren(t *testing.T) map[int][]int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]int{}
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // it ended
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		attr, err := unix.SchedGetAttr(pid, 0)
		if err != nil || attr.Policy != unix.SCHED_IDLE {
			continue
		}
		if cpus, err := processCPUs(pid); err == nil {
			out[pid] = cpus
		}
	}
	return out
}

// PinRedis puts redis-server, and every thread it starts, on the last
// CPU and this process on the others, keeps that CPU busy under
// SCHED_IDLE, and undo gives them back and stops the busy loop.
func TestPinRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("ALLOT_REQUIRE_REDIS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	all, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 2 {
		cpus, undo := PinRedis(nil)
		undo()
		if cpus != nil {
			t.Fatalf("one CPU, yet Redis pinned to %v", cpus)
		}
		t.Skip("one CPU: nothing to pin")
	}
	redis, rest, err := PinnedCPUs()
	if err != nil || redis != all[len(all)-1] || !slices.Equal(rest, all[:len(all)-1]) {
		t.Fatalf("PinnedCPUs = %d, %v, %v; want the last of %v and the rest", redis, rest, err, all)
	}
	cpus, undo := PinRedis(nil)
	if !slices.Equal(cpus, []int{redis}) {
		undo()
		t.Fatalf("PinRedis = %v, want [%d]", cpus, redis)
	}
	if got := threadCPUs(t); len(got) != 1 || !slices.Equal(got[0], rest) {
		t.Errorf("this process's threads on %v, want all on %v", got, rest)
	}
	idle := idleChildren(t)
	if len(idle) != 1 {
		t.Errorf("%d SCHED_IDLE children %v, want one busy loop", len(idle), idle)
	}
	for pid, on := range idle {
		if !slices.Equal(on, cpus) {
			t.Errorf("busy loop %d on %v, want on Redis's %v", pid, on, cpus)
		}
	}
	srv, err := Start(t.Context(), Options{Dir: t.TempDir(), CPUs: cpus})
	if err != nil {
		undo()
		t.Fatal(err)
	}
	defer srv.Kill()
	check := func(when string) {
		t.Helper()
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(srv.Pid()) + "/task")
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) < 2 {
			t.Errorf("%s: redis-server has %d thread(s), want its background threads too", when, len(tasks))
		}
		for _, e := range tasks {
			tid, _ := strconv.Atoi(e.Name())
			if got, err := processCPUs(tid); err == nil && !slices.Equal(got, cpus) {
				t.Errorf("%s: redis-server thread %d on %v, want %v", when, tid, got, cpus)
			}
		}
	}
	check("started")
	if err := srv.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	check("restarted")
	if got := threadCPUs(t); len(got) != 1 || !slices.Equal(got[0], rest) {
		t.Errorf("after starting redis-server, this process's threads on %v, want all on %v", got, rest)
	}
	undo()
	if got := threadCPUs(t); len(got) != 1 || !slices.Equal(got[0], all) {
		t.Errorf("after undo, this process's threads on %v, want all on %v", got, all)
	}
	if got := idleChildren(t); len(got) != 0 {
		t.Errorf("after undo, SCHED_IDLE children %v are left", got)
	}
}
