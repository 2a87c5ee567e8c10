package client

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

func throttled(ms int64) *ratelimitv1.RateLimitResponse {
	return &ratelimitv1.RateLimitResponse{Decision: ratelimitv1.RateLimitResponse_THROTTLED, RetryAfterMs: ms}
}

// A full cache stays at its bound, keeps the newest deny, and drops
// expired entries before live ones.
func TestDenyCacheStaysBounded(t *testing.T) {
	now := time.Unix(0, 0)
	d := newDenyCache(100)
	for i := range 1000 {
		d.put(denyKey{tenant: strconv.Itoa(i)}, throttled(60_000), now)
		assert.LessOrEqual(t, len(d.m), 100)
	}
	_, ok := d.get(denyKey{tenant: "999"}, now)
	assert.True(t, ok, "the newest deny is kept")

	// Half expire; new keys replace expired ones, not live ones.
	d = newDenyCache(64)
	for i := range 32 {
		d.put(denyKey{tenant: "short" + strconv.Itoa(i)}, throttled(1), now)
		d.put(denyKey{tenant: "long" + strconv.Itoa(i)}, throttled(60_000), now)
	}
	later := now.Add(time.Second)
	d.put(denyKey{tenant: "new"}, throttled(60_000), later)
	live := 0
	for k := range d.m {
		if _, ok := d.get(k, later); ok {
			live++
		}
	}
	assert.Equal(t, 33, live, "every live deny kept, and the new one")
}

// BenchmarkDenyCachePutFull: a new key into a full cache of the default
// size whose entries are all live (a broad throttle).
func BenchmarkDenyCachePutFull(b *testing.B) {
	now := time.Unix(0, 0)
	d := newDenyCache(DefaultDenyCache)
	for i := range DefaultDenyCache {
		d.put(denyKey{tenant: strconv.Itoa(i)}, throttled(3_600_000), now)
	}
	keys := make([]denyKey, 1024)
	for i := range keys {
		keys[i] = denyKey{tenant: "n" + strconv.Itoa(i)}
	}
	resp := throttled(3_600_000)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		d.put(keys[i%len(keys)], resp, now)
	}
}
