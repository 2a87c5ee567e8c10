package region

// The script-argument codec: algorithm Groups laid out as the check
// scripts' KEYS and ARGV, and their replies read back as Results.

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lua"
)

// scriptArgs lays a group out as check.lua and refund.lua expect: the keys,
// and 5 ARGV per key. It rejects what would silently misbehave in Redis.
func (sa *specArgs) scriptArgs(g algorithm.Group) ([]string, []any, error) {
	keys := make([]string, len(g))
	args := make([]any, 0, len(g)*lua.ArgsPerKey)
	tag := hashTag(g[0].Key)
	for i, it := range g {
		sp, err := sa.of(it.Spec)
		if err != nil {
			return nil, nil, fmt.Errorf("key %q: %w", it.Key, err)
		}
		switch {
		case it.Cost < 0:
			return nil, nil, fmt.Errorf("key %q: cost %d must not be negative", it.Key, it.Cost)
		case slices.Contains(keys[:i], it.Key):
			// Two items on one bucket would each be checked against the
			// same tokens and the second write would hide the first take.
			return nil, nil, fmt.Errorf("key %q appears twice in one group", it.Key)
		case hashTag(it.Key) != tag:
			// A cluster would refuse the call (CROSSSLOT); refuse it on a
			// single server too, so a deployment change cannot break it.
			return nil, nil, fmt.Errorf("keys %q and %q do not share a hash tag", g[0].Key, it.Key)
		}
		keys[i] = it.Key
		args = append(args, sp...)
		args = append(args, it.Cost)
	}
	return keys, args, nil
}

// specArgs boxes each spec's four script arguments (algorithm code,
// limit, period in ms, burst) once: a check would otherwise allocate
// three interface values per key, though a node's checks are of a few
// policies. Only specs that passed Validate are kept, so a kept spec is
// not validated again per check. At most maxSpecArgs specs are kept
// (policies reload; a spec past the bound is validated and boxed per
// call, as before).
type specArgs struct {
	m sync.Map // algorithm.Spec -> []any
	n atomic.Int32
}

const maxSpecArgs = 4096

// of returns sp's boxed script arguments, or Validate's error. Validate
// also rejects sub-millisecond periods: the scripts take milliseconds,
// and Redis and package algorithm would disagree.
func (sa *specArgs) of(sp algorithm.Spec) ([]any, error) {
	if v, ok := sa.m.Load(sp); ok {
		return v.([]any), nil
	}
	if err := sp.Validate(); err != nil {
		return nil, err
	}
	a := []any{sp.Algorithm.Code(), sp.Limit, sp.Period.Milliseconds(), sp.Capacity()}
	if sa.n.Load() < maxSpecArgs {
		if _, loaded := sa.m.LoadOrStore(sp, a); !loaded {
			sa.n.Add(1)
		}
	}
	return a, nil
}

// hashTag is the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}', if non-empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// parseCheck turns check.lua's reply into a Result.
func parseCheck(cmd *redis.Cmd, n int) (algorithm.Result, error) {
	// Read in place (not Int64Slice: a copy per check).
	vals, err := cmd.Slice()
	if err != nil {
		return algorithm.Result{}, err
	}
	if len(vals) != 1+3*n {
		return algorithm.Result{}, fmt.Errorf("check.lua returned %d values for %d keys", len(vals), n)
	}
	var bad error
	num := func(i int) int64 {
		v, ok := vals[i].(int64)
		if !ok && bad == nil {
			bad = fmt.Errorf("check.lua returned %T %v at %d, want an integer", vals[i], vals[i], i)
		}
		return v
	}
	r := algorithm.Result{Allowed: num(0) == 1, Items: make([]algorithm.ItemResult, n)}
	for i := range n {
		r.Items[i] = algorithm.ItemResult{
			Remaining:  num(1 + 3*i),
			RetryAfter: micros(num(2 + 3*i)),
			ResetAfter: micros(num(3 + 3*i)),
		}
	}
	if bad != nil {
		return algorithm.Result{}, bad
	}
	return r, nil
}

func micros(us int64) time.Duration {
	if us < 0 {
		return algorithm.Never
	}
	return time.Duration(us) * time.Microsecond
}
