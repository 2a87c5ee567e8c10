// Package memstore is the in-process counter store: a node's in standalone
// mode (no Redis), and under the local fallback's scaling
// (internal/fallback). It runs the same algorithms as the Redis scripts
// (algorithm.Decide and algorithm.Refund, the twins of check.lua and
// refund.lua) over a sharded map, with an injected clock.
//
// memstore owns the counters' state in process and nothing else: it never
// talks to the network, never chooses a limit (every take names its
// algorithm.Spec) and keeps nothing across restarts.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

const stripes = 64

// sweepEvery is how many takes on a stripe trigger a sweep of its idle
// buckets: memory follows active keys without a background goroutine.
const sweepEvery = 4096

// Store holds each key's algorithm state in memory. A group's keys share a hash tag and so a
// stripe, as they share a slot in Redis Cluster: one lock makes the group
// atomic.
type Store struct {
	now     func() int64 // microseconds
	seed    maphash.Seed
	stripes [stripes]stripe
}

type stripe struct {
	mu      sync.Mutex
	buckets map[string]*entry
	takes   int
}

type entry struct {
	state   algorithm.State
	expires int64 // microseconds; idle after this, the key is fresh again
}

// New returns a store reading time from now; nil means the wall clock.
func New(now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	s := &Store{now: func() int64 { return now().UnixMicro() }, seed: maphash.MakeSeed()}
	for i := range s.stripes {
		s.stripes[i].buckets = map[string]*entry{}
	}
	return s
}

// Len is the number of buckets held (for tests and metrics).
func (s *Store) Len() int {
	n := 0
	for i := range s.stripes {
		sh := &s.stripes[i]
		sh.mu.Lock()
		n += len(sh.buckets)
		sh.mu.Unlock()
	}
	return n
}

func (s *Store) stripe(key string) *stripe {
	return &s.stripes[maphash.String(s.seed, hashTag(key))%stripes]
}

// hashTag is the part of key between the first { and the next }, as Redis
// Cluster hashes it.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// Take takes every group all-or-nothing. A group with an invalid item
// (algorithm.Spec.Validate, a negative cost, a key twice) is an error, as
// in package region, and nothing of any group is taken.
func (s *Store) Take(_ context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	if err := validate(groups); err != nil {
		return nil, fmt.Errorf("memstore: take: %w", err)
	}
	out := make([]algorithm.Result, len(groups))
	for gi, g := range groups {
		out[gi] = s.take(g)
	}
	return out, nil
}

func validate(groups []algorithm.Group) error {
	var errs []error
	for gi, g := range groups {
		for i, it := range g {
			if err := it.Spec.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("group %d key %q: %w", gi, it.Key, err))
			}
			if it.Cost < 0 {
				errs = append(errs, fmt.Errorf("group %d key %q: cost %d must not be negative", gi, it.Key, it.Cost))
			}
			for _, prev := range g[:i] {
				if prev.Key == it.Key {
					// Both items would be decided on the same state and the
					// second write would hide the first take.
					errs = append(errs, fmt.Errorf("group %d: key %q appears twice", gi, it.Key))
				}
			}
		}
	}
	return errors.Join(errs...)
}

func (s *Store) take(g algorithm.Group) algorithm.Result {
	res := algorithm.Result{Allowed: true, Items: make([]algorithm.ItemResult, len(g))}
	if len(g) == 0 {
		return res
	}
	sh := s.stripe(g[0].Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	sh.maybeSweep(now)
	var small [4]algorithm.Decision
	ds := small[:0]
	for _, it := range g {
		d := algorithm.Decide(it.Spec, sh.get(it.Key, now), now, it.Cost)
		res.Allowed = res.Allowed && d.OK
		ds = append(ds, d)
	}
	for i, it := range g {
		if res.Allowed {
			sh.put(it.Key, ds[i].Next, now+ds[i].TTL.Microseconds())
		}
		// Nothing is written on a denial, as in the script.
		res.Items[i] = ds[i].Result(res.Allowed)
	}
	return res
}

// Refund gives back what a successful take of each group took.
func (s *Store) Refund(_ context.Context, groups []algorithm.Group) error {
	if err := validate(groups); err != nil {
		return fmt.Errorf("memstore: refund: %w", err)
	}
	for _, g := range groups {
		if len(g) == 0 {
			continue
		}
		sh := s.stripe(g[0].Key)
		sh.mu.Lock()
		now := s.now()
		for _, it := range g {
			e, ok := sh.buckets[it.Key]
			if !ok || e.expires <= now {
				continue // gone idle: it is fresh
			}
			next, ttl, ok := algorithm.Refund(it.Spec, e.state, now, it.Cost)
			if !ok {
				continue
			}
			expires := e.expires
			if ttl > 0 {
				expires = now + ttl.Microseconds()
			}
			sh.put(it.Key, next, expires)
		}
		sh.mu.Unlock()
	}
	return nil
}

// get returns the live state at key, or the zero State.
func (sh *stripe) get(key string, now int64) algorithm.State {
	if e, ok := sh.buckets[key]; ok && e.expires > now {
		return e.state
	}
	return algorithm.State{}
}

func (sh *stripe) put(key string, st algorithm.State, expires int64) {
	if e, ok := sh.buckets[key]; ok {
		e.state, e.expires = st, expires
		return
	}
	sh.buckets[key] = &entry{state: st, expires: expires}
}

func (sh *stripe) maybeSweep(now int64) {
	sh.takes++
	if sh.takes < sweepEvery {
		return
	}
	sh.takes = 0
	for k, e := range sh.buckets {
		if e.expires <= now {
			delete(sh.buckets, k)
		}
	}
}
