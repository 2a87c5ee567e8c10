package region

// The call engine: every Store method (Take, Refund, Lease, Return,
// Settle) hands its script calls to a request, which queues each for its
// key's shard (pipeline.go coalesces and sends them) and waits for their
// replies. This one path is what makes every call of the store seen by
// its shard's breaker and stall judgement.

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lua"
)

// call is one script call of a request, queued for a shard. Its
// arguments are either laid out by its caller (keys and args: leases,
// returns, settlements) or a group of checks or refunds (group), laid
// out when its pipeline is sent, straight into the wire command.
type call struct {
	req    *request
	idx    int // its reply's index in req.replies
	script *redis.Script
	keys   []string
	args   []any
	group  algorithm.Group
	enq    time.Time // when it was queued
	state  atomic.Uint32
}

const (
	callPending uint32 = iota
	callDone
)

// reply is one call's answer: the script's reply as go-redis reads it
// (integers as int64, strings as string, arrays as []any), or an error.
type reply struct {
	val any
	err error
}

// request is the calls of one Store method invocation, answered when
// every call is done (answered, failed or given up on).
type request struct {
	replies []reply
	calls   []call
	pending atomic.Int32
	// done receives once, when the last call is done: a channel of the
	// store's (Store.dones), given back once received.
	done chan struct{}
	// Storage for the common request of one call (one group), so that it
	// costs one allocation instead of three, and for its results
	// (resultRoom) when it is a take of up to two keys.
	reply1  [1]reply
	call1   [1]call
	ptr1    [1]*call
	result1 [1]algorithm.Result
	items1  [2]algorithm.ItemResult
}

// finish settles c with its reply, unless it is settled already: exactly
// one party (the pipeline that sent it, the stall judgement, or the
// waiter giving up) settles each call, and the last one releases the
// waiter.
func (r *request) finish(c *call, val any, err error) {
	if !c.state.CompareAndSwap(callPending, callDone) {
		return
	}
	r.replies[c.idx] = reply{val, err}
	if r.pending.Add(-1) == 0 {
		r.done <- struct{}{}
	}
}

// newRequest returns a request for n calls of script, each to be set up
// by the caller (call's keys and args, or its group) before run.
func newRequest(script *redis.Script, n int) *request {
	r := &request{}
	if n == 1 {
		r.replies, r.calls = r.reply1[:], r.call1[:]
	} else {
		r.replies, r.calls = make([]reply, n), make([]call, n)
	}
	for i := range r.calls {
		r.calls[i].req, r.calls[i].idx, r.calls[i].script = r, i, script
	}
	return r
}

// run queues the request's calls that carry something (keys or a group;
// the others are answered nil at once) for their keys' shards
// (shard.submit), which coalesce concurrent calls into shared pipelines
// (EVALSHA, then EVAL for NOSCRIPT), and waits for their replies. Errors
// stay in the replies: ErrUnavailable (breaker open, not sent),
// ErrStalled (the shard stopped answering), an overloaded error (shed),
// or the caller's ctx error when it gave up first — wrapped as
// overloaded, since the shard was not judged sick; the call may still
// run.
func (s *Store) run(ctx context.Context, r *request) []reply {
	n := 0
	for i := range r.calls {
		if r.calls[i].keyCount() > 0 {
			n++
		}
	}
	if n == 0 {
		return r.replies
	}
	r.done = s.dones.get()
	defer s.dones.put(r)
	r.pending.Store(int32(n))
	type batch struct {
		sh    *shard
		calls []*call
	}
	var bb [4]batch
	batches := bb[:0]
	for i := range r.calls {
		c := &r.calls[i]
		if c.keyCount() == 0 {
			c.state.Store(callDone)
			continue
		}
		sh := s.shardOf(ctx, c.firstKey())
		bi := -1
		for x := range batches {
			if batches[x].sh == sh {
				bi = x
				break
			}
		}
		if bi < 0 {
			batches = append(batches, batch{sh: sh})
			bi = len(batches) - 1
			if n == 1 {
				batches[bi].calls = r.ptr1[:0]
			}
		}
		batches[bi].calls = append(batches[bi].calls, c)
	}
	for _, b := range batches {
		b.sh.submit(ctx, b.calls)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		err := &overloaded{cause: "the caller stopped waiting before the reply", err: ctx.Err()}
		for i := range r.calls {
			r.finish(&r.calls[i], nil, err)
		}
		<-r.done
	}
	return r.replies
}

func (c *call) keyCount() int {
	if c.group != nil {
		return len(c.group)
	}
	return len(c.keys)
}

func (c *call) firstKey() string {
	if c.group != nil {
		return c.group[0].Key
	}
	return c.keys[0]
}

// appendArgs appends the call's key count, KEYS and ARGV to cmd, in its
// script's own layout: a group's keys and, per key, its spec's boxed
// arguments (specArgs) and its cost, as check.lua and refund.lua take
// them.
func (c *call) appendArgs(cmd []any, specs *specArgs) []any {
	if c.group == nil {
		cmd = append(cmd, len(c.keys))
		for _, k := range c.keys {
			cmd = append(cmd, k)
		}
		return append(cmd, c.args...)
	}
	cmd = append(cmd, len(c.group))
	for i := range c.group {
		cmd = append(cmd, &c.group[i].Key) // go-redis writes the string; boxing a copy would allocate
	}
	for i := range c.group {
		sp, _ := specs.of(c.group[i].Spec) // validated when the call was made
		cmd = append(cmd, sp...)
		cmd = append(cmd, c.group[i].Cost)
	}
	return cmd
}

// noRetry marks a script call that go-redis must not send again after a
// connection error: the script may have run and only its reply been
// lost, and a lease or a return run twice would debit or credit twice.
// (MaxRetries: -1 covers single-server clients; a cluster pipeline
// re-sends a batch after a broken connection within MaxRedirects unless
// a command says NoRetry.) A MOVED or ASK redirect is still followed: the
// script did not run on the wrong node.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// wireCall is one script command of a pipeline: the calls at idx, all
// of script. A lone call is sent as itself; the token-bucket checks of a
// pipeline, when there are several, share one command of lua.CheckTB in
// its batch layout (shared), so that Redis parses, looks up and enters
// one script for all of them. (A lone check stays in check.lua's layout,
// which lua.CheckTB also takes: the batch layout costs a one-group call
// about a quarter more, docs/performance.md "Token-bucket script".)
type wireCall struct {
	script *redis.Script
	idx    []int
	one    [1]int // storage of idx for a lone call
}

// shared reports whether w carries several checks in the batch layout.
func (w *wireCall) shared() bool { return len(w.idx) > 1 }

// wireCalls groups a pipeline's calls into commands. On a Redis Cluster
// every call stays alone: a script's keys must share one slot there, and
// the calls of one shard need not. (wire never grows past its capacity,
// so a lone call's idx may point into its own element.)
func (s *Store) wireCalls(calls []*call, wire []wireCall) []wireCall {
	if cap(wire) < len(calls) {
		wire = make([]wireCall, 0, len(calls))
	}
	tb := -1 // the index in wire of the token-bucket checks' command
	for i, c := range calls {
		batch := c.script == lua.CheckTB && s.single != nil
		if batch && tb >= 0 {
			w := &wire[tb]
			if !w.shared() {
				w.idx = append(make([]int, 0, len(calls)-i+1), w.idx[0])
			}
			w.idx = append(w.idx, i)
			continue
		}
		if batch {
			tb = len(wire)
		}
		wire = append(wire, wireCall{script: c.script})
		w := &wire[len(wire)-1]
		w.one[0] = i
		w.idx = w.one[:]
	}
	return wire
}

// queue queues w's command (name "evalsha" or "eval", a constant, whose
// boxing costs nothing; payload the hash or the source) on p, its
// arguments laid out straight into the command, marked noRetry. The
// arguments are laid out in *args, reused: the command holds them until
// its pipeline was executed.
func (w *wireCall) queue(ctx context.Context, p redis.Pipeliner, calls []*call, specs *specArgs, name, payload any, args *[]any) *redis.Cmd {
	a := slices.Grow((*args)[:0], 3+8*len(w.idx))
	a = append(a, name, payload)
	if !w.shared() {
		a = calls[w.idx[0]].appendArgs(a, specs)
	} else {
		a = lua.AppendCheckTB(a, len(w.idx), func(i int) int { return len(calls[w.idx[i]].group) },
			func(i, j int) (any, []any, any) {
				it := &calls[w.idx[i]].group[j]
				sp, _ := specs.of(it.Spec)
				return &it.Key, sp, it.Cost
			})
	}
	*args = a
	c := redis.NewCmd(ctx, a...)
	c.SetFirstKeyPos(3) // routes the call to the keys' slot
	_ = p.Process(ctx, noRetry{c})
	return c
}

// settle hands each call of w its reply in out (by its index in the
// pipeline): the command's, for a lone call; for a shared command, its
// group's element of the reply, or the shared command's error (a failed
// connection, or a script error that failed them all).
func (w *wireCall) settle(sent *redis.Cmd, out []reply) {
	if !w.shared() {
		out[w.idx[0]] = reply{sent.Val(), sent.Err()}
		return
	}
	err := sent.Err()
	var vals []any
	if err == nil {
		vals, err = lua.CheckTBReplies(sent.Val(), len(w.idx))
	}
	for j, i := range w.idx {
		switch {
		case err != nil:
			out[i] = reply{err: err}
		default:
			if e, ok := vals[j].(error); ok {
				out[i] = reply{err: e}
			} else {
				out[i] = reply{val: vals[j]}
			}
		}
	}
}

// doneChans are the channels requests are answered on, reused: each
// receives exactly one value (the last call's finish) and is given back
// only after it was received, so a channel comes back empty.
type doneChans struct{ pool sync.Pool }

func (d *doneChans) get() chan struct{} {
	if c, ok := d.pool.Get().(chan struct{}); ok {
		return c
	}
	return make(chan struct{}, 1)
}

// put gives r's channel back; r has received from it.
func (d *doneChans) put(r *request) {
	d.pool.Put(r.done)
	r.done = nil
}
