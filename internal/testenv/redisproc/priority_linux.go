package redisproc

import "golang.org/x/sys/unix"

// prioritise runs redis-server's main thread (the one that serves
// commands) under SCHED_FIFO, where this process may (root): it then
// never waits for a CPU behind other processes, as a Redis on a host of
// its own would not. CPU affinity (Options.CPUs) keeps the node and the
// generator off Redis's CPU; this keeps everything else off it too, and
// serves the tests that do not pin. Without the privilege the server
// keeps its default policy.
func prioritise(pid int) {
	_ = unix.SchedSetAttr(pid, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 1}, 0)
}
