package region

// The pipeline engine: calls queued per shard, coalesced into pipelines
// and sent by reused workers. The stall judgement that watches them is in
// stall.go, the breaker that gates them in breaker.go.

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/lua"
)

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
	one   [1]*call // storage of calls for a pipeline of one
	// sent is when its goroutine began sending it (zero before): time
	// before that is this node's (a goroutine waiting for a CPU), never
	// the shard's.
	sent      time.Time
	abandoned bool      // its calls were settled by a stall; its outcome is ignored
	due       time.Time // when the stall rule next looks at it (stall.go)
}

// shard is one Redis master as this store sees it: its breaker, the
// calls queued for it, the pipelines in flight, and what was received
// from it. Calls are coalesced: while Options.Pipelines pipelines are in
// flight, new calls queue and go out together in the next pipeline (at
// most Options.MaxBatch calls), so a busy node sends fewer, larger round
// trips, and an idle one sends each call at once. A pipeline not yet full
// yields once (runtime.Gosched) before it is sent and takes the calls
// queued meanwhile, so checks whose goroutines were already runnable
// share its round trip (send; ARCHITECTURE.md, "Coalescing").
type shard struct {
	s    *Store
	addr string
	prog *progress // bytes received on this address's connections

	mu       sync.Mutex
	client   *redis.Client // for probes: the master's own (a single server's is the store's); nil only for unknownShard
	brk      *breaker      // nil when breakers are disabled
	queue    []*call
	inflight []*pipe    // in send order
	work     chan *pipe // hands a pipeline to an idle worker
	watch    *time.Timer
	watchDue time.Time
	armed    bool
	probeT   *time.Timer
	lastUse  time.Time
}

// submit queues calls (all for this shard) and sends them if a pipeline
// slot is free. It fails them at once (settling each) when the breaker is
// open or the queue is full.
func (sh *shard) submit(ctx context.Context, calls []*call) {
	now := time.Now()
	sh.mu.Lock()
	sh.lastUse = now
	var err error
	switch {
	case sh.s.closed.Load():
		err = redis.ErrClosed
	case sh.brk != nil && sh.brk.state != BreakerClosed:
		err = fmt.Errorf("%w: %s: breaker %s", ErrUnavailable, sh.addr, sh.brk.state)
	case len(sh.queue)+len(calls) > sh.s.opts.MaxQueue:
		sh.s.stats.shed.Add(int64(len(calls)))
		err = &overloaded{cause: fmt.Sprintf("%d calls already queued for %s", len(sh.queue), sh.addr)}
	}
	if err != nil {
		sh.mu.Unlock()
		for _, c := range calls {
			c.req.finish(c, nil, err)
		}
		return
	}
	for _, c := range calls {
		c.enq = now
	}
	sh.queue = append(sh.queue, calls...)
	sh.kick(now, false)
	sh.arm(now)
	sh.mu.Unlock()
}

// kick sends queued calls while pipeline slots are free. Called with mu
// held. With self, the first new pipeline is returned for the caller (a
// worker done with its own) to send next, rather than handed to another
// goroutine: one goroutine wake-up fewer per round trip under load.
func (sh *shard) kick(now time.Time, self bool) (mine *pipe) {
	for len(sh.queue) > 0 && len(sh.inflight) < sh.s.opts.Pipelines {
		p := &pipe{}
		if len(sh.queue) == 1 {
			p.calls = p.one[:0]
		}
		p.calls = sh.dequeue(p.calls)
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

// dequeue appends to calls the oldest queued calls, up to
// Options.MaxBatch in all. Called with mu held.
func (sh *shard) dequeue(calls []*call) []*call {
	n := min(len(sh.queue), sh.s.opts.MaxBatch-len(calls))
	if n <= 0 {
		return calls
	}
	calls = append(calls, sh.queue[:n]...)
	// The rest moves to the front, so the queue keeps its array for the
	// next submits instead of growing a new one each round trip.
	rest := copy(sh.queue, sh.queue[n:])
	clear(sh.queue[rest:])
	sh.queue = sh.queue[:rest]
	return calls
}

// worker sends p, then waits for the next pipeline of the shard until the
// store closes. Workers are reused rather than started per pipeline (a
// new goroutine grows its stack through go-redis's call depth every
// time); there are as many as pipelines were ever in flight at once, and
// an idle one costs no CPU.
func (sh *shard) worker(p *pipe) {
	defer sh.s.wg.Done()
	var b sendBuffers
	for {
		if p = sh.send(p, &b); p != nil {
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
func (sh *shard) send(p *pipe, b *sendBuffers) *pipe {
	s := sh.s
	if len(p.calls) < s.opts.MaxBatch {
		// Calls whose goroutines are already runnable (the checks of
		// requests read in one go) join p rather than wait for the next
		// round trip: one yield, then p takes what they queued. Without
		// it, the first of them goes alone and the rest follow in a
		// second pipeline (docs/performance.md, "Pipeline sizes"). An
		// idle node has nothing runnable, and sends at once.
		runtime.Gosched()
		sh.mu.Lock()
		if !p.abandoned {
			p.calls = sh.dequeue(p.calls)
		}
		sh.mu.Unlock()
	}
	b.ctx.deadline = time.Now().Add(s.opts.MaxWait)
	ctx := &b.ctx // a pointer: boxing a copy into context.Context would allocate
	wire := s.wireCalls(p.calls, b.wire[:0])
	b.wire = wire
	sent := grow(b.sent, len(wire))
	b.sent = sent
	if b.pl == nil {
		b.pl = s.client.Pipeline()
	}
	pl := b.pl
	args := grow(b.args, len(wire))
	b.args = args
	for i, w := range wire {
		sent[i] = w.queue(ctx, pl, p.calls, &s.specs, "evalsha", s.hashArg(w.script), &args[i])
	}
	sh.mu.Lock()
	p.sent = time.Now()
	p.due = p.sent.Add(s.opts.Timeout)
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
		for _, i := range again {
			sent[i] = wire[i].queue(ctx, pl, p.calls, &s.specs, "eval", lua.Source(wire[i].script), &args[i])
		}
		_, _ = pl.Exec(ctx)
	}
	replies := grow(b.replies, len(p.calls))
	b.replies = replies
	for i, w := range wire {
		w.settle(sent[i], replies)
	}
	now := time.Now()
	var failure error
	for _, r := range replies {
		if shardFailure(r.err) {
			failure = r.err
			break
		}
	}
	s.stats.pipelines.Add(1)
	s.stats.calls.Add(int64(len(replies)))

	sh.mu.Lock()
	if p.abandoned && failure == nil {
		// Logged: a sign of a short freeze, or of a --redis-timeout too
		// tight for this Redis. The answer is a sign of life, as good as
		// a probe's (breaker.answered).
		closed := sh.brk != nil && sh.brk.answered(now)
		s.opts.Logger.Info("redis shard answered a pipeline judged stalled", "shard", sh.addr,
			"after", now.Sub(p.sent).Round(time.Microsecond), "calls", len(p.calls))
		if closed {
			s.opts.Logger.Info("redis circuit breaker", "shard", sh.addr, "to", "closed", "by", "the stalled pipeline's answer")
		}
	}
	if !p.abandoned {
		sh.removeInflight(p)
		if sh.brk != nil && sh.brk.record(now, failure != nil, false) {
			sh.opened(now, failure)
		}
	}
	next := sh.kick(now, true)
	sh.mu.Unlock()
	// The waiters are released before next is sent: they are this
	// round trip's, and next's calls are not the shard's until sent.
	for i, c := range p.calls {
		c.req.finish(c, replies[i].val, replies[i].err)
	}
	clear(sent)    // nothing of this round trip stays reachable from b
	clear(replies) // while the worker waits for the next
	clear(wire)
	for i := range args {
		clear(args[i])
	}
	if failure != nil {
		s.reloadState()
	}
	return next
}

// sendBuffers are a worker's storage for the pipelines it sends, reused
// from one to the next: a round trip's go-redis pipeline, its commands
// and its replies cost no allocation of their own.
type sendBuffers struct {
	ctx     deadlineCtx
	pl      redis.Pipeliner // Exec empties it for the next
	wire    []wireCall
	sent    []*redis.Cmd
	args    [][]any // each command's arguments
	replies []reply
}

// grow returns s resized to n, reallocated only when too small.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
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

// unknownShard names the shard of calls whose master could not be found
// (no cluster state): if the cluster stays unreachable, its breaker opens
// too, instead of every call waiting.
const unknownShard = "cluster (unknown master)"

// shardOf returns the shard serving key: the single server, or for a
// cluster the master of key's slot, from the client's cached slot map
// (refreshed by go-redis on MOVED and periodically, and by reloadState).
func (s *Store) shardOf(ctx context.Context, key string) *shard {
	if s.single != nil {
		return s.single
	}
	c, err := s.client.(*redis.ClusterClient).MasterForKey(ctx, key)
	if err != nil {
		return s.shard(unknownShard, nil)
	}
	return s.shard(c.Options().Addr, c)
}

// shard returns the shard of addr, creating it on first use. client is
// the master's own client, used for probes: a cluster master's, or the
// single server's (the store's own); nil for unknownShard, probed
// through the store's client.
func (s *Store) shard(addr string, client *redis.Client) *shard {
	s.mu.RLock()
	sh := s.shards[addr]
	s.mu.RUnlock()
	if sh == nil {
		s.mu.Lock()
		if sh = s.shards[addr]; sh == nil {
			sh = &shard{s: s, addr: addr, prog: s.conns.of(addr), client: client, work: make(chan *pipe)}
			if !s.opts.Breaker.Disabled {
				sh.brk = &breaker{opts: s.opts.Breaker}
			}
			s.shards[addr] = sh
		}
		s.mu.Unlock()
	}
	if client != nil && sh.client != client {
		sh.mu.Lock()
		sh.client = client
		sh.mu.Unlock()
	}
	return sh
}

// expire takes the calls queued for MaxWait or longer (shed: the node
// could not send them in time) and, when the breaker is open, the rest
// (refused, as new calls are). Called with mu held.
func (sh *shard) expire(now time.Time) (shed, refused []*call) {
	for len(sh.queue) > 0 && now.Sub(sh.queue[0].enq) >= sh.s.opts.MaxWait {
		shed = append(shed, sh.queue[0])
		sh.queue[0] = nil
		sh.queue = sh.queue[1:]
	}
	if sh.brk != nil && sh.brk.state != BreakerClosed {
		refused, sh.queue = sh.queue, nil
	}
	return shed, refused
}

// failExpired fails what expire took.
func (sh *shard) failExpired(shed, refused []*call) {
	failAll(refused, fmt.Errorf("%w: %s: breaker open", ErrUnavailable, sh.addr))
	if len(shed) > 0 {
		sh.s.stats.shed.Add(int64(len(shed)))
		failAll(shed, &overloaded{cause: fmt.Sprintf("not sent to %s within %v", sh.addr, sh.s.opts.MaxWait)})
	}
}

func failAll(calls []*call, err error) {
	for _, c := range calls {
		c.req.finish(c, nil, err)
	}
}

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

// masters is the set of master addresses in a cluster client's slot map,
// or nil for a single server or when the map cannot be read.
func (s *Store) masters() map[string]bool {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var mu sync.Mutex
	m := map[string]bool{}
	// ForEachMaster reads the cached slot map; the callback does no I/O.
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		m[c.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	if err != nil || len(m) == 0 {
		return nil
	}
	return m
}
