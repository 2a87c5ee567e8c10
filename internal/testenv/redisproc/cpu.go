package redisproc

import (
	"fmt"
	"log/slog"
	"os/exec"
)

// A Redis host of its own is what production gives Redis; the test
// machine models it by CPU affinity: redis-server runs on one CPU that
// nothing else the test starts may use, and this process (the load
// generator, or a test binary with its nodes in process) and every child
// it starts after it was pinned (nodes, the no-op server) run on the
// others. That CPU is kept from halting while Redis waits (keepAwake).
// Linux only; elsewhere, and on a machine of one CPU, everything runs
// unpinned.

// PinnedCPUs splits the CPUs this process may run on: the last one is
// Redis's, the rest everyone else's. It fails on a machine where CPU
// affinity cannot be read (not Linux) or with fewer than two CPUs.
func PinnedCPUs() (redis int, rest []int, err error) {
	cpus, err := allowedCPUs()
	if err != nil {
		return 0, nil, err
	}
	if len(cpus) < 2 {
		return 0, nil, fmt.Errorf("this process may run on %d CPU(s) %v: none is left for redis-server alone", len(cpus), cpus)
	}
	return cpus[len(cpus)-1], cpus[:len(cpus)-1], nil
}

// PinRedis gives redis-server a CPU of its own (PinnedCPUs): it
// restricts every thread of this process, and so every process it
// starts from now on, to the other CPUs, and returns the CPUs to pass
// in Options.CPUs, and keeps that CPU awake (keepAwake). Where it cannot
// pin it logs why and returns nil: Redis then shares the CPUs as before.
// undo stops the busy loop and gives this process's threads back the
// CPUs they had (children keep theirs); call it when the pinned work is
// over.
func PinRedis(log *slog.Logger) (redisCPUs []int, undo func()) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	noop := func() {}
	redis, rest, err := PinnedCPUs()
	if err != nil {
		log.Warn("redis-server not pinned: it shares the CPUs with the node and the generator", "reason", err)
		return nil, noop
	}
	before, err := allowedCPUs()
	if err == nil {
		err = setProcessCPUs(rest)
	}
	if err != nil {
		// A partial pinning is undone: a thread on fewer CPUs than its
		// siblings would skew what the test measures.
		_ = setProcessCPUs(before)
		log.Warn("redis-server not pinned: cannot set this process's CPU affinity", "reason", err)
		return nil, noop
	}
	log.Info("redis-server pinned to a CPU of its own", "redis_cpu", redis, "others_cpus", rest)
	wake, err := keepAwake(redis)
	if err != nil {
		log.Warn("redis-server's CPU may halt while Redis waits", "reason", err)
		wake = noop
	}
	return []int{redis}, func() {
		wake()
		if err := setProcessCPUs(before); err != nil {
			log.Warn("cannot give this process its CPUs back", "cpus", before, "reason", err)
		}
	}
}

// start starts cmd, on cpus when set, ahead of other processes
// (prioritise). A failure to pin is logged and the process started
// unpinned: never a reason not to run.
func start(cmd *exec.Cmd, cpus []int) error {
	if len(cpus) == 0 {
		if err := cmd.Start(); err != nil {
			return err
		}
		prioritise(cmd.Process.Pid)
		return nil
	}
	pinErr, err := startOn(cmd, cpus)
	if pinErr != nil {
		slog.Warn("redis-server started without its own CPU", "cpus", cpus, "reason", pinErr)
	}
	if err == nil {
		prioritise(cmd.Process.Pid)
	}
	return err
}
