package sim

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rebalance"
	regionstore "github.com/allot-dev/allot/region"
)

// store is one region's Redis: a hash per key, changed only by the
// project's scripts (lease.lua, return.lua, share.lua, check_tb.lua) run
// by the emulator (redis.go), bucket TTLs included, and the coordinators'
// lock (lock_hold.lua, lock_release.lua), a string key. Its methods lay
// out KEYS and ARGV as package region and coord.RedisWriter and
// coord.RedisLock send them and read the replies as they do; none of
// them computes a bucket.
type store struct {
	em *redisEm
	h  []hash
	// strs are the string keys (the lock), not journalled: a failover
	// loses bucket writes only.
	strs map[string]*strVal
	// journal holds each write's previous value for failovers that lose
	// the last writes (nil when the scenario has none).
	journal []undo
	keep    int64 // µs of journal kept
	pruneAt int
	// skewUs is the Redis's clock offset (Skew.Redis), added to the
	// virtual time of every call: its TIME and its keys' expiry.
	skewUs int64
	// The last key slot looked up, as the scripts name one key many times.
	lastKey string
	lastIdx int
}

type undo struct {
	at   int64 // µs
	call int64 // the script call that wrote (one entry per key and call)
	key  int
	prev hash
}

func newStore(em *redisEm, keys int, journal bool, keep time.Duration) *store {
	s := &store{em: em, h: make([]hash, keys), lastIdx: -1}
	if journal {
		s.keep = keep.Microseconds()
		s.journal = []undo{}
	}
	return s
}

// slot implements keyspace.
func (s *store) slot(key string, write bool) *hash {
	if s.lastIdx < 0 || key != s.lastKey {
		s.lastKey, s.lastIdx = key, keyIndex(key)
	}
	k := s.lastIdx
	if write && s.journal != nil {
		n := len(s.journal)
		if n == 0 || s.journal[n-1].key != k || s.journal[n-1].call != s.em.calls {
			now := s.em.nowUs - timeBase
			s.journal = append(s.journal, undo{at: now, call: s.em.calls, key: k, prev: s.h[k]})
			// Forget what no failover can lose any more, when the journal
			// has doubled since the last time (amortised O(1) per write).
			if len(s.journal) >= s.pruneAt {
				cut := sort.Search(len(s.journal), func(i int) bool { return s.journal[i].at >= now-s.keep })
				s.journal = append(s.journal[:0], s.journal[cut:]...)
				s.pruneAt = max(4096, 2*len(s.journal))
			}
		}
	}
	return &s.h[k]
}

// str implements keyspace: every key that is not a bucket's is a string.
func (s *store) str(key string) *strVal {
	if strings.HasPrefix(key, "rl:{") {
		return nil
	}
	v := s.strs[key]
	if v == nil {
		if s.strs == nil {
			s.strs = map[string]*strVal{}
		}
		v = &strVal{}
		s.strs[key] = v
	}
	return v
}

// failover undoes every write of the last loss µs (the replica promoted
// had not received them) and returns the keys undone, latest first.
func (s *store) failover(now, loss int64) (undone []int) {
	now += s.skewUs
	for i := len(s.journal) - 1; i >= 0 && s.journal[i].at > now-loss; i-- {
		s.h[s.journal[i].key] = s.journal[i].prev
		undone = append(undone, s.journal[i].key)
		s.journal = s.journal[:i]
	}
	return undone
}

func (s *store) eval(sc script, now int64, keys, argv []string) any {
	return s.em.eval(s, sc, now+s.skewUs, keys, argv)
}

// itoa is an integer argument as go-redis sends it.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// lease is lease.lua for one group, with region.Store.Lease's arguments
// and reading of the reply.
func (s *store) lease(now int64, g lease.Group) lease.Reply {
	keys := make([]string, len(g))
	argv := make([]string, 0, 5*len(g))
	for i, it := range g {
		keys[i] = it.Key
		argv = append(argv, itoa(it.Spec.Limit), itoa(it.Spec.Period.Milliseconds()), itoa(it.Spec.Capacity()), itoa(it.Need), itoa(it.Want))
	}
	rep := s.eval(scriptLease, now, keys, argv)
	r, err := parseLease(rep, len(g))
	if err != nil {
		return lease.Reply{Err: fmt.Errorf("sim: lease %s: %w", g[0].Key, err)}
	}
	return r
}

func parseLease(rep any, n int) (lease.Reply, error) {
	if e, ok := rep.(replyError); ok {
		return lease.Reply{}, e
	}
	vals, ok := rep.([]any)
	if !ok {
		return lease.Reply{}, fmt.Errorf("lease.lua returned %v for %d keys", rep, n)
	}
	return regionstore.LeaseReply(vals, n)
}

// check is check_tb.lua in check.lua's layout (a node's lone check) for
// one token of key: whether it was admitted.
func (s *store) check(now int64, key string, spec algorithm.Spec) bool {
	rep := s.eval(scriptCheckTB, now, []string{key},
		[]string{spec.Algorithm.Code(), itoa(spec.Limit), itoa(spec.Period.Milliseconds()), itoa(spec.Capacity()), "1"})
	vals, ok := rep.([]any)
	if !ok || len(vals) != 4 {
		panic(fmt.Sprintf("sim: check_tb.lua on %s returned %v", key, rep))
	}
	return vals[0] == int64(1)
}

// giveBack is return.lua for one item: the whole tokens credited.
func (s *store) giveBack(now int64, it lease.ReturnItem) int64 {
	rep := s.eval(scriptReturn, now, []string{it.Key},
		[]string{itoa(it.Spec.Limit), itoa(it.Spec.Period.Milliseconds()), itoa(it.Spec.Capacity()), itoa(it.Unspent), itoa(it.Age.Microseconds())})
	n, ok := rep.(int64)
	if !ok {
		panic(fmt.Sprintf("sim: return.lua on %s returned %v", it.Key, rep))
	}
	return n
}

// share is share.lua with coord.RedisWriter.WriteShares's arguments
// (coord.ShareArgs).
func (s *store) share(now int64, u coord.ShareUpdate) {
	rep := s.eval(scriptShare, now, []string{u.Key}, redisArgs(coord.ShareArgs(u)))
	if rep != int64(1) {
		panic(fmt.Sprintf("sim: share.lua on %s returned %v", u.Key, rep))
	}
}

// hold is lock_hold.lua with coord.RedisLock.Hold's arguments: whether
// id holds the lock key now.
func (s *store) hold(now int64, key, id string, ttl time.Duration) bool {
	rep := s.eval(scriptLockHold, now, []string{key}, redisArgs(coord.LockHoldArgs(id, ttl)))
	n, ok := rep.(int64)
	if !ok {
		panic(fmt.Sprintf("sim: lock_hold.lua on %s returned %v", key, rep))
	}
	return n == 1
}

// release is lock_release.lua with coord.RedisLock.Release's arguments:
// whether id held the lock key and gave it up.
func (s *store) release(now int64, key, id string) bool {
	rep := s.eval(scriptLockRelease, now, []string{key}, redisArgs(coord.LockReleaseArgs(id)))
	n, ok := rep.(int64)
	if !ok {
		panic(fmt.Sprintf("sim: lock_release.lua on %s returned %v", key, rep))
	}
	return n == 1
}

// redisArgs are script arguments as go-redis writes them.
func redisArgs(as []any) []string {
	out := make([]string, len(as))
	for i, a := range as {
		switch v := a.(type) {
		case string:
			out[i] = v
		case int64:
			out[i] = itoa(v)
		case int:
			out[i] = strconv.Itoa(v)
		case float64:
			out[i] = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			panic(fmt.Sprintf("sim: a script argument of type %T", a))
		}
	}
	return out
}

// field is key k's field f at now (µs), as HGET reads it: absent when the
// key has expired.
func (s *store) field(now int64, k, f int) (float64, bool) {
	now += s.skewUs
	h := &s.h[k]
	if h.has&(1<<f) == 0 || h.exp != 0 && (timeBase+now)/1000 > s.em.baseMs+int64(h.exp)-1 {
		return 0, false
	}
	return h.v[f], true
}

// shareOf is the share in force as coord.RedisWriter.ReadShares reads
// it (HGET rate, coord.ShareOfRate); false when none was written.
func (s *store) shareOf(now int64, k int, global coord.Limit) (rebalance.Share, bool) {
	v, ok := s.field(now, k, fRate)
	if !ok {
		return 0, false
	}
	return coord.ShareOfRate(v, global)
}

// rate is the rate key k's bucket enforces at now: a written share's, or
// the node's policy numbers (lease.lua's fallback).
func (s *store) rate(now int64, k int, policy float64) float64 {
	if v, ok := s.field(now, k, fRate); ok && v > 0 {
		return v
	}
	return policy
}
