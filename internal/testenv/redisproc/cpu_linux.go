package redisproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// allowedCPUs is the CPUs the calling thread may run on, ascending.
func allowedCPUs() ([]int, error) { return processCPUs(0) }

func cpuSet(cpus []int) unix.CPUSet {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return set
}

// setProcessCPUs restricts every thread of this process to cpus. A new
// thread inherits the mask of the thread that creates it, and the Go
// runtime may create one during a pass over /proc/self/task, so passes
// repeat until one finds every thread already on cpus.
func setProcessCPUs(cpus []int) error {
	want := cpuSet(cpus)
	for range 20 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		changed := false
		for _, e := range tasks {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			var cur unix.CPUSet
			err = unix.SchedGetaffinity(tid, &cur)
			if err == nil && cur == want {
				continue
			}
			if err == nil {
				err = unix.SchedSetaffinity(tid, &want)
				changed = true
			}
			if err != nil && !errors.Is(err, unix.ESRCH) { // ESRCH: the thread ended
				return fmt.Errorf("thread %d: %w", tid, err)
			}
		}
		if !changed {
			return nil
		}
	}
	return errors.New("threads kept starting with other CPUs")
}

// startOn starts cmd on cpus: a thread of its own takes cpus, forks the
// child (which inherits the mask before redis-server runs, so every
// thread it starts has it too) and takes its own mask back. pinErr says
// why the child was started unpinned.
func startOn(cmd *exec.Cmd, cpus []int) (pinErr, err error) {
	type result struct{ pinErr, err error }
	done := make(chan result, 1)
	go func() { // ends once the child is started
		// The thread is unlocked, not left to end with the goroutine:
		// the kernel sends a child's Pdeathsig when the thread that
		// forked it ends.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var old unix.CPUSet
		pinErr := unix.SchedGetaffinity(0, &old)
		if pinErr == nil {
			set := cpuSet(cpus)
			pinErr = unix.SchedSetaffinity(0, &set)
		}
		err := cmd.Start()
		if pinErr == nil {
			if e := unix.SchedSetaffinity(0, &old); e != nil {
				pinErr = fmt.Errorf("child pinned, but the starting thread kept its CPUs: %w", e)
			}
		}
		done <- result{pinErr, err}
	}()
	r := <-done
	return r.pinErr, r.err
}

// processCPUs is the CPUs process (or thread) pid may run on,
// ascending; pid 0 is the calling thread.
func processCPUs(pid int) ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var out []int
	for c := 0; len(out) < set.Count(); c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}
