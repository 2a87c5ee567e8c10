// Package memstore is the in-process store of standalone mode: the same
// algorithms as the Redis scripts, over a sharded map, with an injected
// clock. It never talks to the network.
package memstore

import (
	"context"
	"hash/maphash"
	"strings"
	"sync"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

const shards = 64

// sweepEvery is how many takes on a shard trigger a sweep of its idle
// buckets: memory follows active keys without a background goroutine.
const sweepEvery = 4096

// Store holds buckets in memory. A group's keys share a hash tag and so a
// shard, as they share a slot in Redis Cluster: one lock makes the group
// atomic.
type Store struct {
	now    func() int64 // microseconds
	seed   maphash.Seed
	shards [shards]shard
}

type shard struct {
	mu      sync.Mutex
	buckets map[string]*entry
	takes   int
}

type entry struct {
	state   algorithm.BucketState
	expires int64 // microseconds; idle after this, the bucket is full again
}

// New returns a store reading time from now; nil means the wall clock.
func New(now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	s := &Store{now: func() int64 { return now().UnixMicro() }, seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].buckets = map[string]*entry{}
	}
	return s
}

// Len is the number of buckets held (for tests and metrics).
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.buckets)
		sh.mu.Unlock()
	}
	return n
}

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, hashTag(key))%shards]
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

// Take takes every group all-or-nothing.
func (s *Store) Take(_ context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	out := make([]algorithm.Result, len(groups))
	for gi, g := range groups {
		out[gi] = s.take(g)
	}
	return out, nil
}

func (s *Store) take(g algorithm.Group) algorithm.Result {
	res := algorithm.Result{Allowed: true, Items: make([]algorithm.ItemResult, len(g))}
	if len(g) == 0 {
		return res
	}
	sh := s.shard(g[0].Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	sh.maybeSweep(now)
	states := make([]algorithm.BucketState, len(g))
	for i, it := range g {
		var st algorithm.BucketState
		if e, ok := sh.buckets[it.Key]; ok && e.expires > now {
			st = e.state
		}
		states[i] = st.Refill(it.Spec, now)
		ok, r := states[i].Check(it.Spec, it.Cost)
		res.Items[i] = r
		res.Allowed = res.Allowed && ok
	}
	if !res.Allowed {
		// Nothing is written on a denial, as in the script; remaining is
		// what the bucket holds without this request.
		for i, it := range g {
			_, r := states[i].Check(it.Spec, 0)
			res.Items[i].Remaining, res.Items[i].ResetAfter = r.Remaining, r.ResetAfter
		}
		return res
	}
	for i, it := range g {
		st := states[i]
		st.Tokens -= float64(it.Cost)
		sh.put(it.Key, st, now+it.Spec.TTL().Microseconds())
	}
	return res
}

// Refund gives back what a successful take of each group took.
func (s *Store) Refund(_ context.Context, groups []algorithm.Group) error {
	for _, g := range groups {
		if len(g) == 0 {
			continue
		}
		sh := s.shard(g[0].Key)
		sh.mu.Lock()
		now := s.now()
		for _, it := range g {
			e, ok := sh.buckets[it.Key]
			if !ok || e.expires <= now {
				continue // gone idle: it is full
			}
			st := e.state.Refill(it.Spec, now)
			st.Tokens = min(float64(it.Spec.Capacity()), st.Tokens+float64(it.Cost))
			sh.put(it.Key, st, now+it.Spec.TTL().Microseconds())
		}
		sh.mu.Unlock()
	}
	return nil
}

func (sh *shard) put(key string, st algorithm.BucketState, expires int64) {
	if e, ok := sh.buckets[key]; ok {
		e.state, e.expires = st, expires
		return
	}
	sh.buckets[key] = &entry{state: st, expires: expires}
}

func (sh *shard) maybeSweep(now int64) {
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
