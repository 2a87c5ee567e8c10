package sweep

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// pauses is what pauseEvery did.
type pauses struct {
	n       int           // pauses made
	longest time.Duration // the longest time the process was stopped
	err     error         // a signal that could not be sent
}

// pauseEvery stops p (SIGSTOP) for pause and continues it (SIGCONT), as
// CFS throttling does to a process over its CPU quota: the first time
// every/2 after start, then once every every, until ctx ends. It always
// leaves p running; a pause under way when ctx ends is cut short.
func pauseEvery(ctx context.Context, p *proc, start, every, pause time.Duration) (ps pauses) {
	next := time.Now().Add(start + every/2)
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return ps
		case <-t.C:
		}
		t0 := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			ps.err = fmt.Errorf("SIGSTOP %s: %w", p.name, err)
			return ps
		}
		t = time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		err := p.cmd.Process.Signal(syscall.SIGCONT)
		ps.longest = max(ps.longest, time.Since(t0))
		if err != nil {
			ps.err = fmt.Errorf("SIGCONT %s: %w", p.name, err)
			return ps
		}
		ps.n++
		next = t0.Add(every)
	}
}
