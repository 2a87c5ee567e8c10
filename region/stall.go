package region

// The stall rule (README, "Failure handling"): a shard is stalled when a
// connection to it has had no byte of reply for T (Options.Timeout)
// since it last wrote, and nothing it received waits unread. The evidence
// is this process's own sockets (progress, conn.go).

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrStalled is returned (wrapped) for calls a stalled shard held: they
// were sent and may still run (hence DeadlineExceeded, not Unavailable).
var ErrStalled = fmt.Errorf("region: redis shard stalled (no reply within the stall threshold): %w", context.DeadlineExceeded)

// arm schedules the next check while calls are queued or in flight: when
// the oldest pipeline is due to be judged, or the oldest queued call
// reaches MaxWait. Called with mu held.
func (sh *shard) arm(now time.Time) {
	if len(sh.inflight) == 0 && len(sh.queue) == 0 {
		return
	}
	due := now.Add(sh.s.opts.Timeout)
	if p := sh.oldestSent(); p != nil {
		due = p.due
	}
	if len(sh.queue) > 0 && sh.queue[0].enq.Add(sh.s.opts.MaxWait).Before(due) {
		due = sh.queue[0].enq.Add(sh.s.opts.MaxWait)
	}
	if sh.armed && !due.Before(sh.watchDue) {
		return // a check comes soon enough
	}
	sh.armed, sh.watchDue = true, due
	if sh.watch == nil {
		sh.watch = time.AfterFunc(max(due.Sub(now), 0), sh.check)
		return
	}
	sh.watch.Reset(max(due.Sub(now), 0))
}

// check is the watch timer's body: it judges the oldest pipeline when
// due (failing every call the shard holds if it stalled), and expires the
// queue.
func (sh *shard) check() {
	now := time.Now()
	s, t := sh.s, sh.s.opts.Timeout
	sh.mu.Lock()
	sh.armed = false
	if s.closed.Load() {
		sh.mu.Unlock()
		return
	}
	var settle []*call
	var stallErr error
	if old := sh.oldestSent(); old != nil && !now.Before(old.due) {
		if silent := sh.prog.silentFor(now, t); silent < t {
			// Not written yet, answered, or a reply waits unread: look
			// again when the longest wait could reach T.
			old.due = now.Add(t - silent)
		} else {
			stallErr = fmt.Errorf("%w: %s: no reply for %v to a request written (%d pipelines outstanding, the oldest sent %v ago)",
				ErrStalled, sh.addr, silent.Round(time.Microsecond), len(sh.inflight), now.Sub(old.sent).Round(time.Microsecond))
			for _, p := range sh.inflight {
				p.abandoned = true
				settle = append(settle, p.calls...)
			}
			sh.inflight = nil
			if sh.brk == nil {
				// No breaker to refuse them: the calls queued behind the
				// silent pipeline fail with it.
				settle, sh.queue = append(settle, sh.queue...), nil
			}
			s.stats.stalls.Add(1)
			if sh.brk != nil && sh.brk.record(now, true, true) {
				sh.opened(now, stallErr)
			}
		}
	}
	shed, refused := sh.expire(now)
	sh.kick(now, false)
	sh.arm(now)
	sh.mu.Unlock()
	failAll(settle, stallErr)
	sh.failExpired(shed, refused)
	if stallErr != nil {
		s.reloadState()
	}
}

// opened runs when the breaker opens: log it and schedule the first
// probe. Called with mu held.
func (sh *shard) opened(now time.Time, cause error) {
	sh.s.opts.Logger.Log(context.Background(), slog.LevelWarn, "redis circuit breaker", "shard", sh.addr, "to", "open", "err", cause)
	sh.scheduleProbe(now)
}

func (sh *shard) scheduleProbe(now time.Time) {
	if sh.brk.state != BreakerOpen {
		return
	}
	d := max(sh.brk.probeAt.Sub(now), 0)
	if sh.probeT == nil {
		sh.probeT = time.AfterFunc(d, sh.probe)
	} else {
		sh.probeT.Reset(d)
	}
}

// probeFloor is the least time a probe's PING is given: a probe failed
// by this node's own delay only postpones recovery.
const probeFloor = 10 * time.Millisecond

// probe PINGs the shard of an open breaker; an answer within
// max(T, probeFloor) closes it. No request waits for a probe.
func (sh *shard) probe() {
	s := sh.s
	s.mu.RLock() // Close sets closed under s.mu: no wg.Add after its Wait
	if s.closed.Load() {
		s.mu.RUnlock()
		return
	}
	s.wg.Add(1)
	s.mu.RUnlock()
	defer s.wg.Done()
	sh.mu.Lock()
	due := sh.brk != nil && sh.brk.probeDue(time.Now())
	if !due && sh.brk != nil {
		sh.scheduleProbe(time.Now())
	}
	var client redis.Cmdable = s.client
	if sh.client != nil {
		client = sh.client // the master's own (a single server's is the store's)
	}
	sh.mu.Unlock()
	if !due {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.Timeout, probeFloor))
	err := client.Ping(ctx).Err()
	cancel()
	sh.mu.Lock()
	sh.brk.probed(time.Now(), err == nil)
	sh.scheduleProbe(time.Now())
	sh.mu.Unlock()
	if err != nil {
		s.reloadState()
		return
	}
	s.opts.Logger.Info("redis circuit breaker", "shard", sh.addr, "to", "closed")
}
