package region

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lua"
)

// LeaseItem asks one bucket for tokens to spend in memory.
type LeaseItem struct {
	Key  string
	Spec algorithm.Spec
	// Need is what must be granted for the group to succeed (the cost of
	// a waiting request); 0 takes whatever the bucket has, up to Want.
	Need int64
	// Want is the grant size asked for; it must be >= Need.
	Want int64
}

// LeaseGroup is the items of one subject: one script call, all-or-nothing
// on every item's Need.
type LeaseGroup []LeaseItem

// Grant is what lease.lua answered for one item.
type Grant struct {
	Granted int64
	// Left is the whole tokens left in the region bucket after the grant.
	Left int64
	// RetryAfter is 0 if the item's Need could be granted now, Never if it
	// never can (Need > Burst), else how long until it could.
	RetryAfter time.Duration
	// Burst and Rate (tokens/s) are the bucket's effective numbers: the
	// policy's, or the region share a coordinator wrote into the hash.
	Burst int64
	Rate  float64
}

// LeaseResult answers one LeaseGroup. Err is set when the call failed (the
// grants are then unknown; a call whose reply was lost may have granted).
type LeaseResult struct {
	Granted bool
	Items   []Grant
	Err     error
}

// ReturnItem gives back tokens a lease did not spend.
type ReturnItem struct {
	Key     string
	Spec    algorithm.Spec
	Unspent int64
	// Age is how long ago the lease holding them was asked for, measured
	// from before the lease call was sent (never shorter than the truth).
	Age time.Duration
}

// Lease runs lease.lua once per group, every group in one pipelined round
// trip (a cluster client splits it per node). Groups fail independently:
// each result carries its own error. ctx bounds the call, as it does a
// Take's: the lease manager gives each refill its deadline
// (lease.Options.CallTimeout). The returned error is for arguments
// the caller got wrong; nothing was sent then.
func (s *Store) Lease(ctx context.Context, groups []LeaseGroup) ([]LeaseResult, error) {
	keys := make([][]string, len(groups))
	args := make([][]any, len(groups))
	for i, g := range groups {
		if len(g) == 0 {
			continue
		}
		k, a, err := leaseArgs(g)
		if err != nil {
			return nil, fmt.Errorf("region: lease: group %d: %w", i, err)
		}
		keys[i], args[i] = k, a
	}
	cmds := s.evalAll(ctx, lua.Lease, keys, args)
	out := make([]LeaseResult, len(groups))
	for i, g := range groups {
		if len(g) == 0 {
			out[i] = LeaseResult{Granted: true}
			continue
		}
		r, err := parseLease(cmds[i], len(g))
		if err != nil {
			out[i] = LeaseResult{Err: fmt.Errorf("region: lease %s: %w", g[0].Key, err)}
			continue
		}
		out[i] = r
	}
	return out, nil
}

// Return runs return.lua once per item, all in one pipelined round trip,
// and returns the whole tokens the buckets were credited. ctx bounds the
// call (the lease manager's CallTimeout).
func (s *Store) Return(ctx context.Context, items []ReturnItem) (int64, error) {
	keys := make([][]string, len(items))
	args := make([][]any, len(items))
	for i, it := range items {
		if err := checkSpec(it.Key, it.Spec); err != nil {
			return 0, fmt.Errorf("region: return: %w", err)
		}
		if it.Unspent < 0 || it.Age < 0 {
			return 0, fmt.Errorf("region: return: key %q: negative unspent %d or age %v", it.Key, it.Unspent, it.Age)
		}
		keys[i] = []string{it.Key}
		args[i] = []any{it.Spec.Limit, it.Spec.Period.Milliseconds(), it.Spec.Capacity(), it.Unspent, it.Age.Microseconds()}
	}
	cmds := s.evalAll(ctx, lua.Return, keys, args)
	var total int64
	var errs []error
	for i, c := range cmds {
		if c == nil {
			continue
		}
		n, err := c.Int64()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", items[i].Key, err))
			continue
		}
		total += n
	}
	if err := errors.Join(errs...); err != nil {
		return total, fmt.Errorf("region: return: %w", err)
	}
	return total, nil
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

// checkSpec rejects what lease.lua and return.lua cannot take: another
// algorithm, or numbers out of algorithm.Spec's bounds (which the checks
// of Take apply too), so a caller that skipped policy compilation cannot
// make the scripts compute with numbers past 2^53.
func checkSpec(key string, sp algorithm.Spec) error {
	if sp.Algorithm != algorithm.TokenBucket {
		return fmt.Errorf("key %q: only token buckets can be leased, not %v", key, sp.Algorithm)
	}
	if err := sp.Validate(); err != nil {
		return fmt.Errorf("key %q: %w", key, err)
	}
	return nil
}

func leaseArgs(g LeaseGroup) ([]string, []any, error) {
	keys := make([]string, len(g))
	args := make([]any, 0, 5*len(g))
	tag := hashTag(g[0].Key)
	for i, it := range g {
		if err := checkSpec(it.Key, it.Spec); err != nil {
			return nil, nil, err
		}
		if it.Need < 0 || it.Want < it.Need {
			return nil, nil, fmt.Errorf("key %q: need %d, want %d: want 0 <= need <= want", it.Key, it.Need, it.Want)
		}
		if hashTag(it.Key) != tag {
			return nil, nil, fmt.Errorf("keys %q and %q do not share a hash tag", g[0].Key, it.Key)
		}
		for _, k := range keys[:i] {
			if k == it.Key {
				return nil, nil, fmt.Errorf("key %q appears twice in one group", it.Key)
			}
		}
		keys[i] = it.Key
		args = append(args, it.Spec.Limit, it.Spec.Period.Milliseconds(), it.Spec.Capacity(), it.Need, it.Want)
	}
	return keys, args, nil
}

func parseLease(cmd *redis.Cmd, n int) (LeaseResult, error) {
	vals, err := cmd.Slice()
	if err != nil {
		return LeaseResult{}, err
	}
	if len(vals) != 1+5*n {
		return LeaseResult{}, fmt.Errorf("lease.lua returned %d values for %d keys", len(vals), n)
	}
	ok, isInt := vals[0].(int64)
	if !isInt {
		return LeaseResult{}, fmt.Errorf("lease.lua: bad reply %v", vals[0])
	}
	r := LeaseResult{Granted: ok == 1, Items: make([]Grant, n)}
	for i := range n {
		v := vals[1+5*i:]
		var g Grant
		var ints [4]int64
		for j := range ints {
			x, isInt := v[j].(int64)
			if !isInt {
				return LeaseResult{}, fmt.Errorf("lease.lua: value %v is not an integer", v[j])
			}
			ints[j] = x
		}
		g.Granted, g.Left, g.RetryAfter, g.Burst = ints[0], ints[1], micros(ints[2]), ints[3]
		rs, isStr := v[4].(string)
		if !isStr {
			return LeaseResult{}, fmt.Errorf("lease.lua: rate %v is not a string", v[4])
		}
		if g.Rate, err = strconv.ParseFloat(rs, 64); err != nil {
			return LeaseResult{}, fmt.Errorf("lease.lua: rate: %w", err)
		}
		r.Items[i] = g
	}
	return r, nil
}
