package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rebalance"
)

var spec100 = algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Second, Burst: 100}

func item(need, want int64) lease.Group {
	return lease.Group{{Key: keyFn(subject(0)), Spec: spec100, Need: need, Want: want}}
}

func testStore(t *testing.T, keys int, journal bool, keep time.Duration) *store {
	t.Helper()
	em, err := newRedisEm(Sources())
	require.NoError(t, err)
	return newStore(em, keys, journal, keep)
}

// The store runs lease.lua: a new bucket is full, grants are capped by
// the whole tokens, refill is rate·elapsed up to the burst, a need the
// bucket cannot give denies with the wait until it could. (The numbers
// are the script's; this checks the arguments and the reading of the
// reply.)
func TestStoreLease(t *testing.T) {
	s := testStore(t, 1, false, 0)
	r := s.lease(0, item(0, 80))
	if !r.Granted || r.Items[0].Granted != 80 || r.Items[0].Left != 20 || r.Items[0].Rate != 100 || r.Items[0].Burst != 100 {
		t.Fatalf("first lease %+v, want 80 granted, 20 left", r)
	}
	r = s.lease(0, item(30, 30))
	if r.Granted || r.Items[0].RetryAfter != 100*time.Millisecond || r.Items[0].Left != 20 {
		t.Fatalf("short of need: %+v, want a denial retrying in 100ms leaving 20", r)
	}
	r = s.lease(100_000, item(30, 50)) // 100 ms later: 30 tokens
	if !r.Granted || r.Items[0].Granted != 30 || r.Items[0].Left != 0 {
		t.Fatalf("after refill %+v, want 30 granted", r)
	}
	r = s.lease(10_000_000, item(0, 500))
	if r.Items[0].Granted != 100 {
		t.Fatalf("after 10 s %+v: the refill must stop at the burst", r)
	}
	r = s.lease(10_000_000, item(101, 101))
	if r.Granted || r.Items[0].RetryAfter != algorithm.Never {
		t.Fatalf("need past the burst: %+v, want never", r)
	}
	assert.True(t, s.check(20_000_000, keyFn(subject(0)), spec100), "check_tb.lua on a refilled bucket")
}

// share.lua: refill at the old numbers up to the write, cap at the new
// burst, then the new numbers apply; a failover loses the last writes.
func TestStoreShareAndFailover(t *testing.T) {
	s := testStore(t, 1, true, time.Second)
	s.lease(0, item(0, 100)) // empty at 0
	third := rebalance.Unit / 3
	global := coord.Limit{Rate: 300, Burst: 300}
	u := coord.ShareUpdate{Key: keyFn(subject(0)), Share: 2 * third, Global: global, Old: coord.Limit{Rate: 100, Burst: 100}, TTL: time.Hour}
	s.share(500_000, u) // 50 tokens refilled at the old rate, then 200/s
	r := s.lease(1_000_000, item(0, 1000))
	if got := r.Items[0].Granted; got < 149 || got > 150 {
		t.Fatalf("granted %d, want 50 + 0.5 s at 200/s = 150", got)
	}
	if got, ok := s.shareOf(1_000_000, 0, global); !ok || got < 2*third || got > 2*third+1 {
		t.Fatalf("share read %d, want %d rounded up", got, 2*third)
	}
	if n := len(s.failover(1_000_000, 600_000)); n != 2 {
		t.Fatalf("undid %d writes, want the share and the last lease", n)
	}
	if got, ok := s.shareOf(1_000_000, 0, global); ok {
		t.Fatalf("share after failover %d, want none (the default)", got)
	}
	if tok, _ := s.field(1_000_000, 0, fTokens); tok != 0 {
		t.Fatalf("after failover %+v: want the state before 0.4 s", s.h[0])
	}
}

// Buckets expire at virtual time: lease.lua sets the TTL of a refill from
// empty plus a second (here 1 s + 1 s), after which the key is gone; a
// share's TTL (share.lua, only extended) keeps the key past it.
func TestStoreTTL(t *testing.T) {
	s := testStore(t, 2, false, 0)
	s.lease(0, item(0, 100))
	key := keyFn(subject(0))
	assert.Equal(t, int64(2000), s.em.pttl(s, key, 0))
	assert.Equal(t, int64(1), s.em.pttl(s, key, 1_999_000))
	assert.Equal(t, int64(0), s.em.pttl(s, key, 2_000_999), "due, not yet expired (Redis expires when now > expiry)")
	assert.Equal(t, int64(-2), s.em.pttl(s, key, 2_001_000), "expired")
	_, ok := s.field(2_001_000, 0, fTokens)
	assert.False(t, ok)

	other := lease.Group{{Key: keyFn(subject(1)), Spec: spec100, Need: 0, Want: 10}}
	s.lease(0, other)
	s.share(0, coord.ShareUpdate{Key: keyFn(subject(1)), Share: rebalance.Unit / 2, Global: coord.Limit{Rate: 200, Burst: 200}, Old: coord.Limit{Rate: 100, Burst: 100}, TTL: time.Hour})
	s.lease(1_000_000, other) // would set 2 s, keeps the hour
	assert.Equal(t, int64(3600_000-1000), s.em.pttl(s, keyFn(subject(1)), 1_000_000))
}

// The coordinators' lock is lock_hold.lua and lock_release.lua on a
// string key beside the buckets: one holder at a time, renewed by its
// holder only, free once its TTL ran out or released (by its holder
// only).
func TestStoreLock(t *testing.T) {
	s := testStore(t, 1, true, time.Second)
	key, ttl := coord.LockKey("us"), 5*time.Second
	assert.True(t, s.hold(0, key, "a", ttl))
	assert.False(t, s.hold(1_000_000, key, "b", ttl), "held by a")
	assert.True(t, s.hold(2_000_000, key, "a", ttl), "a renews")
	assert.False(t, s.hold(7_000_000, key, "b", ttl), "renewed at 2 s: held to 7 s")
	assert.True(t, s.hold(7_001_000, key, "b", ttl), "a's TTL ran out")
	assert.False(t, s.release(7_002_000, key, "a"), "a no longer holds it")
	assert.False(t, s.hold(7_003_000, key, "a", ttl))
	assert.True(t, s.release(7_004_000, key, "b"))
	assert.True(t, s.hold(7_005_000, key, "a", ttl), "released: free at once")
	assert.Empty(t, s.journal, "the lock is not a bucket: nothing journalled")
}
