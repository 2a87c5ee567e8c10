package sim

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rebalance"
)

var spec100 = algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 100, Period: time.Second, Burst: 100}

func item(need, want int64) lease.Group {
	return lease.Group{{Key: keyFn(subject(0)), Spec: spec100, Need: need, Want: want}}
}

// The store follows lease.lua: a new bucket is full, grants are capped by
// the whole tokens, refill is rate·elapsed up to the burst, a need the
// bucket cannot give denies with the wait until it could.
func TestStoreLease(t *testing.T) {
	s := newStore(1, false, 0)
	r := s.lease(0, []int{0}, item(0, 80))
	if !r.Granted || r.Items[0].Granted != 80 || r.Items[0].Left != 20 {
		t.Fatalf("first lease %+v, want 80 granted, 20 left", r)
	}
	r = s.lease(0, []int{0}, item(30, 30))
	if r.Granted || r.Items[0].RetryAfter != 100*time.Millisecond || r.Items[0].Left != 20 {
		t.Fatalf("short of need: %+v, want a denial retrying in 100ms leaving 20", r)
	}
	r = s.lease(100_000, []int{0}, item(30, 50)) // 100 ms later: 30 tokens
	if !r.Granted || r.Items[0].Granted != 30 || r.Items[0].Left != 0 {
		t.Fatalf("after refill %+v, want 30 granted", r)
	}
	r = s.lease(10_000_000, []int{0}, item(0, 500))
	if r.Items[0].Granted != 100 {
		t.Fatalf("after 10 s %+v: the refill must stop at the burst", r)
	}
}

// share.lua: refill at the old numbers up to the write, cap at the new
// burst, then the new numbers apply; a failover loses the last writes.
func TestStoreShareAndFailover(t *testing.T) {
	s := newStore(1, true, time.Second)
	s.lease(0, []int{0}, item(0, 100)) // empty at 0
	third := rebalance.Unit / 3
	u := coord.ShareUpdate{Key: keyFn(subject(0)), Share: third, Global: coord.Limit{Rate: 300, Burst: 300}, Old: coord.Limit{Rate: 100, Burst: 100}}
	u.Share = 2 * third
	s.share(500_000, 0, u) // 50 tokens refilled at the old rate, then 200/s
	r := s.lease(1_000_000, []int{0}, item(0, 1000))
	if got := r.Items[0].Granted; got < 149 || got > 150 {
		t.Fatalf("granted %d, want 50 + 0.5 s at 200/s = 150", got)
	}
	if s.shareOf(0, third) != 2*third {
		t.Fatal("share not in force")
	}
	if n := len(s.failover(1_000_000, 600_000)); n != 2 {
		t.Fatalf("undid %d writes, want the share and the last lease", n)
	}
	if s.shareOf(0, third) != third || s.b[0].tokens != 0 {
		t.Fatalf("after failover %+v: want the state before 0.4 s", s.b[0])
	}
}
