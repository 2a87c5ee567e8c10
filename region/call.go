package region

// The call engine: every Store method (Take, Refund, Lease, Return) hands
// its script calls to evalAll, which queues each for its key's shard
// (pipeline.go coalesces and sends them) and waits for their answers. This
// one path is what makes every call of the store seen by its shard's
// breaker and stall judgement.

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/lua"
)

// call is one script call of a request, queued for a shard.
type call struct {
	req    *request
	idx    int // its command's index in req.cmds
	script *redis.Script
	keys   []string
	args   []any
	enq    time.Time // when it was queued
	state  atomic.Uint32
}

const (
	callPending uint32 = iota
	callDone
)

// request is the calls of one Store method invocation, answered when
// every call is done (answered, failed or given up on).
type request struct {
	cmds    []*redis.Cmd
	pending atomic.Int32
	done    chan struct{}
	// Storage for the common request of one call (one group), so that it
	// costs one allocation instead of three.
	cmd1  [1]*redis.Cmd
	call1 [1]call
	ptr1  [1]*call
}

// finish settles c with cmd, unless it is settled already: exactly one
// party (the pipeline that sent it, the stall judgement, or the waiter
// giving up) settles each call, and the last one releases the waiter.
func (r *request) finish(c *call, cmd *redis.Cmd) {
	if !c.state.CompareAndSwap(callPending, callDone) {
		return
	}
	r.cmds[c.idx] = cmd
	if r.pending.Add(-1) == 0 {
		close(r.done)
	}
}

func failCmd(ctx context.Context, err error) *redis.Cmd {
	c := redis.NewCmd(ctx)
	c.SetErr(err)
	return c
}

// evalAll runs script once per non-nil keys[i] and waits for the
// answers: each call is queued for its key's shard (shard.submit), which
// coalesces concurrent calls into shared pipelines (EVALSHA, then EVAL for
// NOSCRIPT). Errors stay in the commands: ErrUnavailable (breaker open,
// not sent), ErrStalled (the shard stopped answering), an overloaded
// error (shed), or the caller's ctx error when it gave up first — wrapped
// as overloaded, since the shard was not judged sick; the call may still
// run. Every call of the store goes through here, so every call is seen
// by its shard's breaker.
func (s *Store) evalAll(ctx context.Context, script *redis.Script, keys [][]string, args [][]any) []*redis.Cmd {
	r := &request{}
	if len(keys) == 1 {
		r.cmds = r.cmd1[:]
	} else {
		r.cmds = make([]*redis.Cmd, len(keys))
	}
	n := 0
	for _, k := range keys {
		if k != nil {
			n++
		}
	}
	if n == 0 {
		return r.cmds
	}
	r.done = make(chan struct{})
	r.pending.Store(int32(n))
	var calls []call
	if n == 1 {
		calls = r.call1[:]
	} else {
		calls = make([]call, n)
	}
	type batch struct {
		sh    *shard
		calls []*call
	}
	var bb [4]batch
	batches := bb[:0]
	j := 0
	for i, k := range keys {
		if k == nil {
			continue
		}
		c := &calls[j]
		j++
		c.req, c.idx, c.script, c.keys, c.args = r, i, script, k, args[i]
		sh := s.shardOf(ctx, k[0])
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
		for i := range calls {
			r.finish(&calls[i], failCmd(ctx, err))
		}
		<-r.done
	}
	return r.cmds
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

// scriptCall queues name (EVALSHA or EVAL) of payload (the script's hash
// or source) on keys with args, as redis.Script does, but marked noRetry.
func scriptCall(ctx context.Context, p redis.Pipeliner, name string, payload any, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, payload, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	c := redis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		c.SetFirstKeyPos(3) // routes the call to the keys' slot
	}
	_ = p.Process(ctx, noRetry{c})
	return c
}

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
func (s *Store) wireCalls(calls []*call) []wireCall {
	wire := make([]wireCall, 0, len(calls))
	tb := -1 // the index in wire of the token-bucket checks' command
	for i, c := range calls {
		batch := c.script == lua.CheckTB && !s.cluster
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

// queue queues w's command (name EVALSHA or EVAL, payload the hash or the
// source) on p.
func (w *wireCall) queue(ctx context.Context, p redis.Pipeliner, calls []*call, name string, payload any) *redis.Cmd {
	if !w.shared() {
		c := calls[w.idx[0]]
		return scriptCall(ctx, p, name, payload, c.keys, c.args)
	}
	k, a := lua.CheckTBArgs(len(w.idx), func(j int) ([]string, []any) {
		c := calls[w.idx[j]]
		return c.keys, c.args
	})
	return scriptCall(ctx, p, name, payload, k, a)
}

// settle gives each call of w its own command in cmds: the command sent,
// for a lone call; for a shared command, a command per group holding its
// group's reply or error, or the shared command's error (a failed
// connection, or a script error that failed them all).
func (w *wireCall) settle(ctx context.Context, sent *redis.Cmd, cmds []*redis.Cmd) {
	if !w.shared() {
		cmds[w.idx[0]] = sent
		return
	}
	err := sent.Err()
	var vals []any
	if err == nil {
		vals, err = lua.CheckTBReplies(sent.Val(), len(w.idx))
	}
	for j, i := range w.idx {
		c := redis.NewCmd(ctx)
		if err != nil {
			c.SetErr(err)
		} else if e, ok := vals[j].(error); ok {
			c.SetErr(e)
		} else {
			c.SetVal(vals[j])
		}
		cmds[i] = c
	}
}
