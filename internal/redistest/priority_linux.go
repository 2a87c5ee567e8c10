package redistest

import "golang.org/x/sys/unix"

// prioritise runs the server's main thread (the one that serves
// commands) under SCHED_FIFO: it then never waits for a CPU behind the
// test processes, as a Redis on a host of its own would not. The tests
// judge a silent Redis as stalled after a few milliseconds; on a shared
// CI machine a Redis that waited that long for a CPU would look frozen.
// Without the privilege (not root) the server keeps its default policy,
// and such tests may read a busy machine as a stall.
func prioritise(pid int) {
	_ = unix.SchedSetAttr(pid, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 1}, 0)
}
