package region

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/lua"
)

// ErrStalled is returned (wrapped) for calls a shard held without
// answering: it received calls and sent nothing back for the stall
// threshold. It wraps context.DeadlineExceeded, not ErrUnavailable: the
// calls were sent and may still run (their replies were not waited for).
var ErrStalled = fmt.Errorf("region: redis shard stalled (no reply within the stall threshold): %w", context.DeadlineExceeded)

// overloaded is the error of calls this node shed: the shard was healthy
// but the node could not get the call answered within its bounds (queue
// full, or waiting longer than Options.MaxWait). It is not a store
// failure: callers answer it as overload (shed), not by on_store_failure.
type overloaded struct {
	cause string
	err   error // what ended the wait, if anything (the caller's ctx)
}

func (e *overloaded) Error() string {
	if e.err != nil {
		return "region: node overloaded, call shed: " + e.cause + ": " + e.err.Error()
	}
	return "region: node overloaded, call shed: " + e.cause
}

func (e *overloaded) Unwrap() error { return e.err }

// Overloaded marks the error for decide.IsOverloaded.
func (e *overloaded) Overloaded() bool { return true }

// ErrOverloaded is the error of every shed call (errors.Is matches any
// shed call's error).
var ErrOverloaded error = &overloaded{cause: "queue full or waited too long"}

func (e *overloaded) Is(target error) bool { _, ok := target.(*overloaded); return ok }

// pipe is one pipeline sent to a shard.
type pipe struct {
	calls []*call
	// sent is when its goroutine began sending it (zero before): time
	// before that is this node's (a goroutine waiting for a CPU), never
	// the shard's.
	sent      time.Time
	abandoned bool // its calls were settled by a stall; its outcome is ignored
}

// shard is one Redis master as this store sees it: its breaker, the
// calls queued for it, the pipelines in flight, and the evidence that it
// is making progress. Calls are coalesced: while Options.Pipelines
// pipelines are in flight, new calls queue and go out together in the
// next pipeline (at most Options.MaxBatch calls), so a busy node sends
// fewer, larger round trips, and an idle one sends each call at once.
type shard struct {
	s    *Store
	addr string
	prog *progress // bytes received on this address's connections

	mu       sync.Mutex
	client   *redis.Client // for probes (nil: the store's client)
	brk      *breaker      // nil when breakers are disabled
	queue    []*call
	inflight []*pipe    // in send order
	work     chan *pipe // hands a pipeline to an idle worker
	watch    *time.Timer
	watchDue time.Time
	armed    bool
	lagged   bool // the last check woke late and deferred judgement
	probeT   *time.Timer
	rtt      rttTail // slowest recent round trips, halving every 4 s
	lastUse  time.Time
	firstUse time.Time // the first call queued (zero before): see freshFor
}

// threshold is how long the shard may hold calls without sending anything
// back before it counts as stalled: four times its recent slow round trip
// (rttTail: the (2P+1)-th slowest, P = Options.Pipelines), within
// [Options.Timeout, Options.StallMax]. A shard that is slow because this
// node (or the machine) is busy has shown slow round trips already, and
// gets more time; an idle healthy shard answers in well under
// Options.Timeout, and one hiccup of this process does not stretch it.
// The floor is doubled for a fresh shard (freshFor).
func (sh *shard) threshold(now time.Time) time.Duration {
	floor, ceiling := sh.s.opts.Timeout, max(sh.s.opts.StallMax, sh.s.opts.Timeout)
	if sh.fresh(now) {
		floor = min(freshFactor*floor, ceiling)
	}
	return min(max(stallFactor*sh.recentHigh(now), floor), ceiling)
}

// freshFor is how long after its first call a shard's threshold is at
// least twice Options.Timeout. A node's first moments are its least
// predictable (lazy initialisation, the first collections of a small
// heap, every client arriving at once) and the judgement has least to go
// on: no round trips in the tail, no span of the PSI file yet
// (psiReadEvery). Measured in the sweep: fresh nodes whose shard was
// silent for 4 ms within 15 ms of the load starting, on a healthy Redis
// (docs/benchmarks.md). A Redis frozen at a node's start costs twice the
// floor instead of once; after that, as before.
const freshFor = 500 * time.Millisecond

// freshFactor is how many times Options.Timeout a fresh shard's floor is:
// its own constant, not contendedFactor, which stretches a judgement of a
// starved machine and may change for other reasons.
const freshFactor = 2

// stallFactor and rttHalfLife shape the stall threshold: a multiple of
// the slow round trips of the last several seconds. On busy shared
// cores the tail of healthy round trips is long (Redis itself waits for
// a CPU), and a threshold near it would fail healthy calls.
const (
	stallFactor = 4
	rttHalfLife = 4 * time.Second
)

// recentHigh is the round trip the stall threshold is a multiple of.
func (sh *shard) recentHigh(now time.Time) time.Duration {
	return sh.rtt.rank(now, 2*sh.s.opts.Pipelines+1)
}

func (sh *shard) observeRTT(now time.Time, rtt time.Duration) { sh.rtt.observe(now, rtt) }

// submit queues calls (all for this shard) and sends them if a pipeline
// slot is free. It fails them at once (settling each) when the breaker is
// open or the queue is full.
func (sh *shard) submit(ctx context.Context, calls []*call) {
	now := time.Now()
	sh.mu.Lock()
	sh.lastUse = now
	if sh.firstUse.IsZero() {
		sh.firstUse = now
	}
	var err error
	switch {
	case sh.s.closed.Load():
		err = redis.ErrClosed
	case sh.brk != nil && !sh.brk.allow():
		err = fmt.Errorf("%w: %s: breaker %s", ErrUnavailable, sh.addr, sh.brk.state)
	case len(sh.queue)+len(calls) > sh.s.opts.MaxQueue:
		sh.s.stats.shed.Add(int64(len(calls)))
		err = &overloaded{cause: fmt.Sprintf("%d calls already queued for %s", len(sh.queue), sh.addr)}
	}
	if err != nil {
		sh.mu.Unlock()
		for _, c := range calls {
			c.req.finish(c, failCmd(ctx, err))
		}
		return
	}
	for _, c := range calls {
		c.enq = now
	}
	sh.queue = append(sh.queue, calls...)
	sh.kick(now, false)
	idle := !sh.armed
	sh.arm(now)
	sh.mu.Unlock()
	if idle {
		// The start of the first window a check of this busy spell
		// judges (checks sample the rest); outside mu: a file read.
		sh.s.cpu.sample(now)
	}
}

// kick sends queued calls while pipeline slots are free. Called with mu
// held. With self, the first new pipeline is returned for the caller (a
// worker done with its own) to send next, rather than handed to another
// goroutine: one goroutine wake-up fewer per round trip under load.
func (sh *shard) kick(now time.Time, self bool) (mine *pipe) {
	for len(sh.queue) > 0 && len(sh.inflight) < sh.s.opts.Pipelines {
		n := min(len(sh.queue), sh.s.opts.MaxBatch)
		batch := make([]*call, n)
		copy(batch, sh.queue)
		clear(sh.queue[:n])
		sh.queue = sh.queue[n:]
		if len(sh.queue) == 0 {
			sh.queue = nil
		}
		p := &pipe{calls: batch}
		sh.inflight = append(sh.inflight, p)
		if self && mine == nil {
			mine = p
			continue
		}
		select {
		case sh.work <- p: // an idle worker takes it
		default:
			sh.s.wg.Add(1)
			go sh.worker(p)
		}
	}
	return mine
}

// worker sends p, then waits for the next pipeline of the shard until the
// store closes. Workers are reused rather than started per pipeline (a
// new goroutine grows its stack through go-redis's call depth every
// time); there are as many as pipelines were ever in flight at once, and
// an idle one costs no CPU.
func (sh *shard) worker(p *pipe) {
	defer sh.s.wg.Done()
	for {
		if p = sh.send(p); p != nil {
			continue // the next pipeline, queued while p was out
		}
		select {
		case p = <-sh.work:
		case <-sh.s.done:
			return
		}
	}
}

// send runs one pipeline: one EVALSHA per wire command (wireCalls: the
// token-bucket checks of the pipeline share one), EVAL again for those
// that found the script cache empty (NOSCRIPT: the script did not run).
// Its socket deadline is Options.MaxWait: the calls' waiters are released
// earlier by a stall judgement, so a slow reply never closes a healthy
// connection. It returns the next pipeline of the shard for this
// goroutine to send, if calls queued meanwhile (nil if none).
func (sh *shard) send(p *pipe) *pipe {
	s := sh.s
	ctx := deadlineCtx{deadline: time.Now().Add(s.opts.MaxWait)}
	wire := s.wireCalls(p.calls)
	sent := make([]*redis.Cmd, len(wire))
	pl := s.client.Pipeline()
	for i, w := range wire {
		sent[i] = w.queue(ctx, pl, p.calls, "evalsha", s.hashArg(w.script))
	}
	sh.mu.Lock()
	p.sent = time.Now()
	sh.mu.Unlock()
	_, _ = pl.Exec(ctx)
	var again []int
	for i, c := range sent {
		// The nil check first: HasErrorPrefix allocates even for nil.
		if err := c.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pl := s.client.Pipeline()
		for _, i := range again {
			sent[i] = wire[i].queue(ctx, pl, p.calls, "eval", lua.Source(wire[i].script))
		}
		_, _ = pl.Exec(ctx)
	}
	cmds := make([]*redis.Cmd, len(p.calls))
	for i, w := range wire {
		w.settle(ctx, sent[i], cmds)
	}
	now := time.Now()
	var failure error
	for _, c := range cmds {
		if shardFailure(c.Err()) {
			failure = c.Err()
			break
		}
	}
	s.stats.pipelines.Add(1)
	s.stats.calls.Add(int64(len(cmds)))

	sh.mu.Lock()
	if p.abandoned && failure == nil {
		// Not learnt from: a shard slowed for good would otherwise teach
		// the threshold to wait for it. Logged, as a sign of a threshold
		// too tight for this machine (or of a short freeze). The answer
		// is a sign of life, as good as a probe's (breaker.answered).
		closed := sh.brk != nil && sh.brk.answered(now)
		s.opts.Logger.Info("redis shard answered a pipeline judged stalled", "shard", sh.addr,
			"after", now.Sub(p.sent).Round(time.Microsecond), "calls", len(p.calls))
		if closed {
			s.opts.Logger.Info("redis circuit breaker", "shard", sh.addr, "to", "closed", "by", "the stalled pipeline's answer")
		}
	}
	if !p.abandoned {
		if failure == nil {
			sh.observeRTT(now, now.Sub(p.sent))
		}
		sh.removeInflight(p)
		if sh.brk != nil {
			if failure != nil {
				if sh.brk.failure(now) {
					sh.opened(now, failure)
				}
			} else {
				sh.brk.success(now)
			}
		}
	}
	next := sh.kick(now, true)
	sh.mu.Unlock()
	// The waiters are released before next is sent: they are this
	// round trip's, and next's calls are not the shard's until sent.
	for i, c := range p.calls {
		c.req.finish(c, cmds[i])
	}
	if failure != nil {
		s.reloadState()
	}
	return next
}

// deadlineCtx is a context that is never cancelled and has a deadline:
// a pipeline's socket deadline (go-redis reads it with
// ContextTimeoutEnabled), without the timer and cancel func of
// context.WithTimeout on every round trip. Nothing waits on its Done.
type deadlineCtx struct {
	context.Context // nil: Value finds nothing
	deadline        time.Time
}

func (c deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (deadlineCtx) Done() <-chan struct{}         { return nil }
func (deadlineCtx) Err() error                    { return nil }
func (deadlineCtx) Value(any) any                 { return nil }

// hashArg is script's hash as an EVALSHA argument, boxed once per store:
// a string put in a command's []any is a heap allocation per call.
func (s *Store) hashArg(script *redis.Script) any {
	if h, ok := s.hashes.Load(script); ok {
		return h
	}
	h, _ := s.hashes.LoadOrStore(script, any(script.Hash()))
	return h
}

func (sh *shard) removeInflight(p *pipe) {
	for i, q := range sh.inflight {
		if q == p {
			sh.inflight = append(sh.inflight[:i], sh.inflight[i+1:]...)
			return
		}
	}
}

// arm schedules the next check while calls are queued or in flight.
// Called with mu held.
func (sh *shard) arm(now time.Time) {
	if len(sh.inflight) == 0 && len(sh.queue) == 0 {
		return
	}
	th := sh.threshold(now)
	due := now.Add(th)
	if p := sh.oldestSent(); p != nil {
		due = p.sent.Add(th)
	}
	if len(sh.queue) > 0 {
		due = minTime(due, sh.queue[0].enq.Add(sh.s.opts.MaxWait))
	}
	if sh.armed && !due.Before(sh.watchDue) {
		return // a check comes soon enough
	}
	sh.armAt(now, due)
}

func (sh *shard) armAt(now, due time.Time) {
	sh.armed, sh.watchDue = true, due
	d := max(due.Sub(now), 0)
	if sh.watch == nil {
		sh.watch = time.AfterFunc(d, sh.check)
	} else {
		sh.watch.Reset(d)
	}
}

// oldestSent is the in-flight pipeline sent first, nil if none has been
// sent yet. Called with mu held.
func (sh *shard) oldestSent() *pipe {
	var o *pipe
	for _, p := range sh.inflight {
		if !p.sent.IsZero() && (o == nil || p.sent.Before(o.sent)) {
			o = p
		}
	}
	return o
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// pipeStallFactor: a single pipeline unanswered for this many stall
// thresholds while the shard answers others (a connection that died
// silently) is given up on alone, without opening the breaker.
const pipeStallFactor = 10

// contendedFactor stretches the stall threshold while this process or
// the machine is short of CPU (check): enough for the 2x delays seen on
// a saturated 2-core machine, little enough that a frozen Redis is still
// caught within a few thresholds.
const contendedFactor = 2

// stealGrace is the least silence judged a stall while the hypervisor
// has been taking this machine's CPUs (cpuPressure.stealing): a vCPU it
// paused (Redis's, or this node's network stack's) is silent for as long
// as the pause, which is longer than twice a threshold of a few ms
// (measured here: bursts up to 40 ms, docs/benchmarks.md), and no reading
// of this machine tells a pause under way from a frozen Redis. A Redis
// frozen while steal is high is caught after this instead of 2x the
// threshold; on a machine without steal nothing changes.
const stealGrace = 50 * time.Millisecond

// lateDeferral is how long a check that woke late by late defers its
// judgement: as long as it was late, within [1 ms, th]. A timer that
// fires late means this process did not run; when the whole machine
// stalled (a hypervisor pause, seen in the chaos sandbox as every node's
// shards stalling in the same millisecond and answering 15-35 ms after
// the send), Redis did not run either and needs about as long again
// once both run; 1 ms is enough only for replies already in the socket.
func lateDeferral(late, th time.Duration) time.Duration {
	return min(max(late, time.Millisecond), max(th, time.Millisecond))
}

// starved reports whether silence of the shard for th may be this
// machine's doing: goroutines of this process waited half of th for a
// CPU lately, or the machine's CPUs are contended, for long (avg10) or
// in the last tens of milliseconds (a Redis beside this node waits too),
// or the hypervisor has been taking the machine's CPUs (stealing);
// or the shard is fresh (freshFor) and there is no span of the PSI file
// over the last moments yet to tell (psiReadEvery; or no PSI at all).
// A judgement with nothing to go on at a node's start is made as on a
// contended machine: measured, a fresh node given 256 workers at once
// saw its healthy shard silent for 9.8 ms 17 ms into the load (its
// goroutines had waited 3.1 ms for a CPU), past the fresh floor of 8 ms
// (docs/benchmarks.md); a Redis frozen at a node's start is caught after
// 16 ms instead of 8. Later, with no span either (a lone call after an
// idle spell: a shard that only refills a hot key's lease), the 10 s
// average decides (busyCPUPressure): a lone call to a Redis frozen on a
// busy machine is caught after 8 ms instead of 4, on a quiet one as
// before. Called with mu held.
func (sh *shard) starved(now time.Time, th time.Duration) bool {
	s := sh.s
	if s.lag.recent(now, th/2, th) || s.cpu.contended(now) || s.cpu.stealing(now) {
		return true
	}
	waited, known := s.cpu.waited(now, th)
	if known {
		return waited
	}
	return sh.fresh(now) || s.cpu.busy(now)
}

// fresh reports whether the shard's first call was less than freshFor
// ago. Called with mu held.
func (sh *shard) fresh(now time.Time) bool {
	return !sh.firstUse.IsZero() && now.Sub(sh.firstUse) < freshFor
}

// stallEvidence says what a stall was judged on besides the silence,
// for the log: how old the oldest pipeline was, how much of the last
// moments the machine's tasks waited for a CPU (or that no span of
// them was known) and PSI's 10 s average, and this process's
// longest recent wait, so that a stall of a healthy Redis (a busy or
// paused machine the judgement did not see) can be told apart later.
func (s *Store) stallEvidence(now time.Time, th, age time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "oldest pipeline sent %v ago", age.Round(time.Microsecond))
	if share, span, ok := s.cpu.waitedShare(now, th); ok {
		fmt.Fprintf(&b, "; tasks waited for a CPU %.0f%% of the last %v", 100*share, span.Round(time.Microsecond))
	} else {
		b.WriteString("; no recent span of PSI")
	}
	if avg10 := s.cpu.average(now); avg10 > 0 {
		fmt.Fprintf(&b, "; PSI's 10 s average is %.1f%%", avg10)
	}
	if share, span, ok := s.cpu.stealShare(now); ok {
		fmt.Fprintf(&b, "; the hypervisor took %.1f%% of the CPUs over the last %v", 100*share, span.Round(time.Millisecond))
	}
	if worst, ago := s.lag.latest(now); worst > 0 {
		fmt.Fprintf(&b, "; a goroutine of this node waited %v for a CPU %v ago", worst, ago.Round(time.Millisecond))
	}
	return b.String()
}

// check judges the shard's calls in flight and in the queue: the watch
// timer's body.
//
// The shard is stalled when its oldest pipeline has waited the stall
// threshold, nothing was received from the shard within the threshold,
// and no received bytes wait unread in this node's sockets. The last two
// tell a stalled Redis from a busy node: if this node was too busy to
// read what Redis sent, the bytes are in the socket (or were just read),
// and the calls wait on. A check that itself woke up late defers its
// judgement once, by as long as it was late (lateDeferral), so that the
// runtime's network poller can deliver replies that arrived while the
// process was not running, and a Redis paused with it can answer.
func (sh *shard) check() {
	now := time.Now()
	if sh.s.closed.Load() {
		return
	}
	// Each check samples the machine's CPU waiting (before taking mu: a
	// file read, at most every psiReadEvery), so that a judgement has the
	// last tens of milliseconds to look at.
	sh.s.cpu.sample(now)
	var settle, refused, shed []*call
	var settleErr error
	sh.mu.Lock()
	sh.armed = false
	if sh.s.closed.Load() {
		sh.mu.Unlock()
		return
	}
	th := sh.threshold(now)
	if old := sh.oldestSent(); old != nil && now.Sub(old.sent) >= th {
		heard := now.Sub(time.Unix(0, sh.prog.lastRead.Load())) < th
		age := now.Sub(old.sent)
		switch {
		case heard:
			// Alive; give up on one pipeline only if it is far overdue,
			// and not while this process or the machine is short of CPU:
			// its reply may have been read and wait for its goroutine to
			// run. (A connection that died silently fails at its socket
			// deadline, --redis-max-wait, if starvation lasts that long.)
			if p := old; age >= pipeStallFactor*th && !sh.prog.pending() && !sh.starved(now, th) {
				p.abandoned = true
				sh.removeInflight(p)
				settle, settleErr = p.calls, fmt.Errorf("%w: %s: one pipeline unanswered for %v", ErrStalled, sh.addr, now.Sub(p.sent).Round(time.Microsecond))
				if sh.brk != nil && sh.brk.failure(now) {
					sh.opened(now, settleErr)
				}
			}
		case now.Sub(sh.watchDue) > th/2 && !sh.lagged:
			sh.lagged = true
			sh.armAt(now, now.Add(lateDeferral(now.Sub(sh.watchDue), th)))
			sh.mu.Unlock()
			return
		case sh.prog.pending():
			// Replies wait unread: this node is slow, not the shard.
		case age < contendedFactor*th && sh.starved(now, th):
			// Goroutines of this process waited that long for a CPU
			// lately (the pipeline may have reached the socket late, or
			// its reply been read late), or the machine's CPUs are
			// contended, for long or in the last tens of milliseconds (a
			// Redis beside this node waits for a CPU too), or a fresh
			// shard has no such evidence yet: silence is judged a stall
			// only after twice the threshold.
			sh.armAt(now, minTime(old.sent.Add(contendedFactor*th), now.Add(max(th/4, time.Millisecond))))
			sh.mu.Unlock()
			return
		case age < stealGrace && sh.s.cpu.stealing(now):
			// Past twice the threshold, while the hypervisor has been
			// taking CPUs: a paused vCPU is silent as long as the pause.
			sh.armAt(now, minTime(old.sent.Add(stealGrace), now.Add(max(th/4, time.Millisecond))))
			sh.mu.Unlock()
			return
		default:
			settleErr = fmt.Errorf("%w: %s: nothing received for %v with %d pipelines outstanding (%s)", ErrStalled, sh.addr, th, len(sh.inflight), sh.s.stallEvidence(now, th, age))
			for _, p := range sh.inflight {
				p.abandoned = true
				settle = append(settle, p.calls...)
			}
			sh.inflight = nil
			if sh.brk == nil {
				// No breaker to refuse them: the calls queued behind the
				// silent pipelines fail with them, rather than each
				// waiting a threshold of its own in the next pipeline
				// (with one pipeline in flight, all of them would).
				settle = append(settle, sh.queue...)
				sh.queue = nil
			}
			sh.s.stats.stalls.Add(1)
			if sh.brk != nil && sh.brk.stall(now) {
				sh.opened(now, settleErr)
			}
		}
	}
	sh.lagged = false
	// Calls the node could not even send within MaxWait are shed.
	for len(sh.queue) > 0 && now.Sub(sh.queue[0].enq) >= sh.s.opts.MaxWait {
		shed = append(shed, sh.queue[0])
		sh.queue[0] = nil
		sh.queue = sh.queue[1:]
	}
	if sh.brk != nil && !sh.brk.allow() {
		// Opened: what is still queued is refused, as new calls are.
		refused = sh.queue
		sh.queue = nil
	}
	sh.kick(now, false)
	sh.arm(now)
	sh.mu.Unlock()
	for _, c := range settle {
		c.req.finish(c, failCmd(context.Background(), settleErr))
	}
	if len(refused) > 0 {
		err := fmt.Errorf("%w: %s: breaker open", ErrUnavailable, sh.addr)
		for _, c := range refused {
			c.req.finish(c, failCmd(context.Background(), err))
		}
	}
	if len(shed) > 0 {
		sh.s.stats.shed.Add(int64(len(shed)))
		err := &overloaded{cause: fmt.Sprintf("not sent to %s within %v", sh.addr, sh.s.opts.MaxWait)}
		for _, c := range shed {
			c.req.finish(c, failCmd(context.Background(), err))
		}
	}
	if settleErr != nil {
		sh.s.reloadState()
	}
}

// opened runs when the breaker opens: log it and schedule the first probe.
// Called with mu held.
func (sh *shard) opened(now time.Time, cause error) {
	sh.s.opts.Logger.Log(context.Background(), slog.LevelWarn, "redis circuit breaker", "shard", sh.addr, "to", "open", "err", cause)
	sh.scheduleProbe(now)
}

func (sh *shard) scheduleProbe(now time.Time) {
	at := sh.brk.nextProbe()
	if at.IsZero() {
		return
	}
	d := max(at.Sub(now), 0)
	if sh.probeT == nil {
		sh.probeT = time.AfterFunc(d, sh.probe)
	} else {
		sh.probeT.Reset(d)
	}
}

// probe PINGs the shard of an open breaker; an answer within the stall
// threshold (at least probeFloor) closes it. No request waits for a probe.
func (sh *shard) probe() {
	s := sh.s
	// Under s.mu, so that Close (which sets closed under it) never waits
	// for the WaitGroup while a probe is being added to it.
	s.mu.RLock()
	if s.closed.Load() {
		s.mu.RUnlock()
		return
	}
	s.wg.Add(1)
	s.mu.RUnlock()
	defer s.wg.Done()
	now := time.Now()
	sh.mu.Lock()
	if sh.brk == nil || !sh.brk.probeDue(now) {
		if sh.brk != nil {
			sh.scheduleProbe(now)
		}
		sh.mu.Unlock()
		return
	}
	limit := max(sh.threshold(now), probeFloor)
	client := sh.client
	sh.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), limit)
	var err error
	if client != nil {
		err = client.Ping(ctx).Err()
	} else {
		err = s.client.Ping(ctx).Err()
	}
	cancel()

	now = time.Now()
	sh.mu.Lock()
	sh.brk.probed(now, err == nil)
	if err == nil {
		s.opts.Logger.Info("redis circuit breaker", "shard", sh.addr, "to", "closed")
	} else {
		sh.scheduleProbe(now)
	}
	sh.mu.Unlock()
	if err != nil {
		s.reloadState()
	}
}

// probeFloor is the least time a probe's PING is given: the stall
// threshold of an idle shard is a few milliseconds, and a probe that
// fails for want of CPU only delays recovery.
const probeFloor = 10 * time.Millisecond

func (sh *shard) stop() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.watch != nil {
		sh.watch.Stop()
	}
	if sh.probeT != nil {
		sh.probeT.Stop()
	}
}

// health reports the shard's breaker.
func (sh *shard) health() ShardHealth {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	h := ShardHealth{Shard: sh.addr}
	if sh.brk != nil {
		sh.brk.roll(time.Now())
		h.State = sh.brk.state
		h.Requests, h.Failures = sh.brk.counts()
		h.Openings, h.ProbeFailures = sh.brk.openings, sh.brk.probeFailures
	}
	return h
}
