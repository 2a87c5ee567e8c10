package redisproc

import (
	"fmt"
	"os/exec"

	"golang.org/x/sys/unix"
)

// keepAwake starts a busy loop on cpu under SCHED_IDLE, the policy that
// yields to every other: it runs only while redis-server waits, and is
// there so the CPU never halts. A halted virtual CPU waits for the
// hypervisor to wake it: on the project's VM a PING to a Redis on an
// idle CPU took over 4 ms about once a second, and almost never with
// the loop (docs/performance.md, "Machine"). A Redis host under load,
// or a guest polling before it halts (haltpoll), does not halt between
// requests either. stop kills the loop and waits for it.
func keepAwake(cpu int) (stop func(), err error) {
	cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
	cmd.SysProcAttr = sysProcAttr()
	pinErr, err := startOn(cmd, []int{cpu})
	if err != nil {
		return nil, fmt.Errorf("start the busy loop: %w", err)
	}
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	if pinErr == nil {
		pinErr = unix.SchedSetAttr(cmd.Process.Pid, &unix.SchedAttr{Policy: unix.SCHED_IDLE}, 0)
	}
	if pinErr != nil {
		stop() // unpinned or at a normal priority, it would take CPU from the others
		return nil, fmt.Errorf("busy loop on CPU %d: %w", cpu, pinErr)
	}
	return stop, nil
}
