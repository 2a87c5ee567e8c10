package lease

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// fakeRegion is lease.lua and return.lua over algorithm.BucketState, on
// the test's ManualClock: deterministic unit tests of the manager. The
// scripts themselves are tested against real Redis.
type fakeRegion struct {
	clock *ManualClock
	mu    sync.Mutex
	b     map[string]*algorithm.BucketState
	calls int
	fail  error
	gate  chan struct{} // if set, each Lease waits for a receive
	// rival is what another node takes from each bucket (if it holds
	// that much) just before each Lease: a contended bucket.
	rival float64
	// shared answers that RLQS parts hold every bucket (ItemReply.Shared).
	shared bool
}

func newFake(c *ManualClock) *fakeRegion {
	return &fakeRegion{clock: c, b: map[string]*algorithm.BucketState{}}
}

func (f *fakeRegion) now() int64 { return f.clock.Now() / 1000 }

func (f *fakeRegion) bucket(key string, s algorithm.Spec) *algorithm.BucketState {
	b, ok := f.b[key]
	if !ok {
		b = &algorithm.BucketState{}
		f.b[key] = b
	}
	*b = b.Refill(s, f.now())
	return b
}

func (f *fakeRegion) Lease(ctx context.Context, groups []Group) ([]Reply, error) {
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.fail != nil {
		return nil, f.fail
	}
	out := make([]Reply, len(groups))
	for gi, g := range groups {
		r := Reply{Granted: true, Items: make([]ItemReply, len(g))}
		for i, it := range g {
			b := f.bucket(it.Key, it.Spec)
			if b.Tokens >= f.rival {
				b.Tokens -= f.rival
			}
			r.Items[i] = ItemReply{Burst: it.Spec.Capacity(), Rate: it.Spec.Rate(), Shared: f.shared}
			switch {
			case it.Need > it.Spec.Capacity():
				r.Granted, r.Items[i].RetryAfter = false, algorithm.Never
			case b.Tokens < float64(it.Need):
				r.Granted = false
				r.Items[i].RetryAfter = time.Duration(math.Ceil((float64(it.Need)-b.Tokens)/it.Spec.Rate()*1e6)) * time.Microsecond
			}
		}
		for i, it := range g {
			b := f.b[it.Key]
			if r.Granted {
				n := min(it.Want, int64(math.Floor(b.Tokens)))
				b.Tokens -= float64(n)
				r.Items[i].Granted = n
			}
			r.Items[i].Left = int64(math.Floor(b.Tokens))
		}
		out[gi] = r
	}
	return out, nil
}

func (f *fakeRegion) Return(_ context.Context, items []ReturnItem) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var total float64
	for _, it := range items {
		b := f.bucket(it.Key, it.Spec)
		credit := math.Max(0, float64(it.Unspent)-it.Spec.Rate()*it.Age.Seconds())
		before := b.Tokens
		b.Tokens = math.Min(float64(it.Spec.Capacity()), b.Tokens+credit)
		total += b.Tokens - before
	}
	return int64(total), nil
}

func (f *fakeRegion) tokens(key string, s algorithm.Spec) float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bucket(key, s).Tokens
}
