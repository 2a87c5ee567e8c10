package region

// The script-argument codec: algorithm Groups laid out as the check
// scripts' KEYS and ARGV, and their replies read back as Results.

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// checkGroup rejects a group that would silently misbehave in Redis,
// before anything is sent; its specs' boxed arguments are cached then
// (specArgs), for the pipeline that lays the group out
// (call.appendArgs).
func (sa *specArgs) checkGroup(g algorithm.Group) error {
	tag := hashTag(g[0].Key)
	for i := range g {
		it := &g[i]
		if _, err := sa.of(it.Spec); err != nil {
			return fmt.Errorf("key %q: %w", it.Key, err)
		}
		switch {
		case it.Cost < 0:
			return fmt.Errorf("key %q: cost %d must not be negative", it.Key, it.Cost)
		case hashTag(it.Key) != tag:
			// A cluster would refuse the call (CROSSSLOT); refuse it on a
			// single server too, so a deployment change cannot break it.
			return fmt.Errorf("keys %q and %q do not share a hash tag", g[0].Key, it.Key)
		}
		for j := range i {
			if g[j].Key == it.Key {
				// Two items on one bucket would each be checked against
				// the same tokens and the second write would hide the
				// first take.
				return fmt.Errorf("key %q appears twice in one group", it.Key)
			}
		}
	}
	return nil
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

// decodeCheck decodes check.lua's reply for a group of len(items) keys
// (as go-redis reads it: an array of integers) straight into r, its item
// results in items.
func decodeCheck(val any, r *algorithm.Result, items []algorithm.ItemResult) error {
	vals, ok := val.([]any)
	if !ok {
		return fmt.Errorf("check.lua returned %T, not an array", val)
	}
	n := len(items)
	if len(vals) != 1+3*n {
		return fmt.Errorf("check.lua returned %d values for %d keys", len(vals), n)
	}
	var bad error
	num := func(i int) int64 {
		v, ok := vals[i].(int64)
		if !ok && bad == nil {
			bad = fmt.Errorf("check.lua returned %T %v at %d, want an integer", vals[i], vals[i], i)
		}
		return v
	}
	for i := range items {
		items[i] = algorithm.ItemResult{
			Remaining:  num(1 + 3*i),
			RetryAfter: micros(num(2 + 3*i)),
			ResetAfter: micros(num(3 + 3*i)),
		}
	}
	*r = algorithm.Result{Allowed: num(0) == 1, Items: items}
	return bad
}

func micros(us int64) time.Duration {
	if us < 0 {
		return algorithm.Never
	}
	return time.Duration(us) * time.Microsecond
}
