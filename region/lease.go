package region

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/lua"
)

// Store is the lease manager's Source: its leases and returns share the
// call engine (run) and the shards' pipelines with Take and Refund.
var _ lease.Source = (*Store)(nil)

// Lease runs lease.lua once per group, every group in one pipelined round
// trip (a cluster client splits it per node). Groups fail independently:
// each result carries its own error. ctx bounds the call, as it does a
// Take's: the lease manager gives each refill its deadline
// (lease.Options.CallTimeout). The returned error is for arguments
// the caller got wrong; nothing was sent then.
func (s *Store) Lease(ctx context.Context, groups []lease.Group) ([]lease.Reply, error) {
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
	replies := s.runArgs(ctx, lua.Lease, keys, args)
	out := make([]lease.Reply, len(groups))
	for i, g := range groups {
		if len(g) == 0 {
			out[i] = lease.Reply{Granted: true}
			continue
		}
		r, err := parseLease(replies[i], len(g))
		if err != nil {
			out[i] = lease.Reply{Err: fmt.Errorf("region: lease %s: %w", g[0].Key, err)}
			continue
		}
		out[i] = r
	}
	return out, nil
}

// Return runs return.lua once per item, each call queued for its shard's
// next pipeline as Take's are, and returns the whole tokens the buckets were credited. ctx bounds the
// call (the lease manager's CallTimeout).
func (s *Store) Return(ctx context.Context, items []lease.ReturnItem) (int64, error) {
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
	replies := s.runArgs(ctx, lua.Return, keys, args)
	var total int64
	var errs []error
	for i, r := range replies {
		n, ok := r.val.(int64)
		switch {
		case r.err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", items[i].Key, r.err))
		case !ok:
			errs = append(errs, fmt.Errorf("%s: return.lua returned %T, not an integer", items[i].Key, r.val))
		default:
			total += n
		}
	}
	if err := errors.Join(errs...); err != nil {
		return total, fmt.Errorf("region: return: %w", err)
	}
	return total, nil
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

func leaseArgs(g lease.Group) ([]string, []any, error) {
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

func parseLease(r reply, n int) (lease.Reply, error) {
	if r.err != nil {
		return lease.Reply{}, r.err
	}
	vals, ok := r.val.([]any)
	if !ok {
		return lease.Reply{}, fmt.Errorf("lease.lua returned %T, not an array", r.val)
	}
	return LeaseReply(vals, n)
}

// LeaseReply decodes lease.lua's reply for n keys, as go-redis hands it
// over (integers as int64, strings as string); the simulator's Redis
// hands its replies over the same way.
func LeaseReply(vals []any, n int) (lease.Reply, error) {
	var err error
	if len(vals) != 1+6*n {
		return lease.Reply{}, fmt.Errorf("lease.lua returned %d values for %d keys", len(vals), n)
	}
	ok, isInt := vals[0].(int64)
	if !isInt {
		return lease.Reply{}, fmt.Errorf("lease.lua: bad reply %v", vals[0])
	}
	r := lease.Reply{Granted: ok == 1, Items: make([]lease.ItemReply, n)}
	for i := range n {
		v := vals[1+6*i:]
		var g lease.ItemReply
		var ints [4]int64
		for j := range ints {
			x, isInt := v[j].(int64)
			if !isInt {
				return lease.Reply{}, fmt.Errorf("lease.lua: value %v is not an integer", v[j])
			}
			ints[j] = x
		}
		g.Granted, g.Left, g.RetryAfter, g.Burst = ints[0], ints[1], micros(ints[2]), ints[3]
		rs, isStr := v[4].(string)
		if !isStr {
			return lease.Reply{}, fmt.Errorf("lease.lua: rate %v is not a string", v[4])
		}
		if g.Rate, err = strconv.ParseFloat(rs, 64); err != nil {
			return lease.Reply{}, fmt.Errorf("lease.lua: rate: %w", err)
		}
		shared, isInt := v[5].(int64)
		if !isInt {
			return lease.Reply{}, fmt.Errorf("lease.lua: shared %v is not an integer", v[5])
		}
		g.Shared = shared == 1
		r.Items[i] = g
	}
	return r, nil
}
