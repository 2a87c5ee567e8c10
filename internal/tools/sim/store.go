package sim

import (
	"math"
	"sort"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rebalance"
)

// store is one region's Redis: the token buckets of lease.lua, return.lua
// and share.lua, with their maths (common.lua's refill, tb_rate, the
// share override), one bucket per key. Bucket TTLs are not modelled: an
// expired bucket comes back full, as one idle that long would be, and
// shares are rewritten every interval, within their hour's TTL.
type store struct {
	b []bucket
	// journal holds each write's previous value for failovers that lose
	// the last writes (nil when the scenario has none).
	journal []undo
	keep    int64 // µs of journal kept
	pruneAt int
}

// bucket is a region bucket's hash: tokens at ts (µs), and the
// coordinator's share, rate and burst when one was written.
type bucket struct {
	tokens float64
	ts     int64
	valid  bool // tokens and ts exist
	share  rebalance.Share
	rate   float64 // 0: no share written, the policy's numbers apply
	burst  float64
}

type undo struct {
	at   int64
	key  int
	prev bucket
}

func newStore(keys int, journal bool, keep time.Duration) *store {
	s := &store{b: make([]bucket, keys)}
	if journal {
		s.keep = keep.Microseconds()
		s.journal = []undo{}
	}
	return s
}

func (s *store) write(now int64, k int, b bucket) {
	if s.journal != nil {
		s.journal = append(s.journal, undo{at: now, key: k, prev: s.b[k]})
		// Forget what no failover can lose any more, when the journal has
		// doubled since the last time (amortised O(1) per write).
		if len(s.journal) >= s.pruneAt {
			cut := sort.Search(len(s.journal), func(i int) bool { return s.journal[i].at >= now-s.keep })
			s.journal = append(s.journal[:0], s.journal[cut:]...)
			s.pruneAt = max(4096, 2*len(s.journal))
		}
	}
	s.b[k] = b
}

// failover undoes every write of the last loss µs (the replica promoted
// had not received them) and returns the keys undone, latest first.
func (s *store) failover(now, loss int64) (undone []int) {
	for i := len(s.journal) - 1; i >= 0 && s.journal[i].at > now-loss; i-- {
		s.b[s.journal[i].key] = s.journal[i].prev
		undone = append(undone, s.journal[i].key)
		s.journal = s.journal[:i]
	}
	return undone
}

// numbers are the bucket's effective rate and burst: the share's when one
// was written (lease.lua: "a coordinator share overrides").
func (b *bucket) numbers(spec algorithm.Spec) (rate, burst float64) {
	rate, burst = spec.Rate(), float64(spec.Capacity())
	if b.rate > 0 {
		rate = b.rate
	}
	if b.burst > 0 {
		burst = b.burst
	}
	return rate, burst
}

// refilled is common.lua's refill at now; a missing bucket is full.
func (b bucket) refilled(now int64, rate, burst float64) bucket {
	if !b.valid {
		b.tokens, b.ts, b.valid = burst, now, true
		return b
	}
	elapsed := max(now-b.ts, 0)
	b.tokens = math.Min(burst, b.tokens+float64(elapsed)*rate/1e6)
	b.ts = max(b.ts, now)
	return b
}

// lease is lease.lua for one group: all-or-nothing on need, each item
// granted min(want, floor(tokens)).
func (s *store) lease(now int64, keys []int, g lease.Group) lease.Reply {
	r := lease.Reply{Granted: true, Items: make([]lease.Grant, len(g))}
	next := make([]bucket, len(g))
	for i, it := range g {
		rate, burst := s.b[keys[i]].numbers(it.Spec)
		b := s.b[keys[i]].refilled(now, rate, burst)
		next[i] = b
		r.Items[i] = lease.Grant{Burst: int64(math.Floor(burst)), Rate: rate}
		switch {
		case float64(it.Need) > burst:
			r.Granted, r.Items[i].RetryAfter = false, algorithm.Never
		case b.tokens < float64(it.Need):
			r.Granted = false
			r.Items[i].RetryAfter = time.Duration(math.Ceil((float64(it.Need)-b.tokens)/rate*1e6)) * time.Microsecond
		}
	}
	for i, it := range g {
		b := next[i]
		if r.Granted {
			n := min(it.Want, int64(math.Floor(b.tokens)))
			b.tokens -= float64(n)
			r.Items[i].Granted = n
			s.write(now, keys[i], b)
		}
		r.Items[i].Left = int64(math.Floor(b.tokens))
	}
	return r
}

// check is check.lua's token bucket for one token: allowed when the
// bucket holds it, which it then takes; a denial changes nothing.
func (s *store) check(now int64, k int, spec algorithm.Spec) bool {
	rate, burst := s.b[k].numbers(spec)
	b := s.b[k].refilled(now, rate, burst)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	s.write(now, k, b)
	return true
}

// giveBack is return.lua for one item: credit max(0, unspent - rate·age),
// capped at the burst; a missing bucket is full already.
func (s *store) giveBack(now int64, k int, it lease.ReturnItem) int64 {
	b := s.b[k]
	if !b.valid {
		return 0
	}
	rate, burst := b.numbers(it.Spec)
	b = b.refilled(now, rate, burst)
	credit := math.Max(0, float64(it.Unspent)-rate*it.Age.Seconds())
	before := b.tokens
	b.tokens = math.Min(burst, b.tokens+credit)
	s.write(now, k, b)
	return int64(b.tokens - before)
}

// share is share.lua: refill at the old numbers up to now, cap at the new
// burst, store the new numbers.
func (s *store) share(now int64, k int, u coord.ShareUpdate) {
	b := s.b[k]
	oldRate, oldBurst := u.Old.Rate, u.Old.Burst
	if b.rate > 0 {
		oldRate, oldBurst = b.rate, b.burst
	}
	rate, burst := u.Share.Of(u.Global.Rate), u.Share.Of(u.Global.Burst)
	if b.valid {
		b = b.refilled(now, oldRate, oldBurst)
		b.tokens = math.Min(b.tokens, burst)
	}
	b.share, b.rate, b.burst = u.Share, rate, burst
	s.write(now, k, b)
}

// shareOf is the share in force (RedisWriter.ReadShares: from the stored
// rate), def when none was written.
func (s *store) shareOf(k int, def rebalance.Share) rebalance.Share {
	if s.b[k].rate <= 0 {
		return def
	}
	return s.b[k].share
}
