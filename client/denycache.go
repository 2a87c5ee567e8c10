package client

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// denyKey is a request's identity: every field the node decides on.
type denyKey struct {
	tenant, client, route, method, ip, tier string
	cost                                    int32
}

func keyOf(r *ratelimitv1.RateLimitRequest) denyKey {
	return denyKey{r.GetTenantId(), r.GetClientIdentifier(), r.GetRoute(), r.GetMethod(), r.GetIp(), r.GetTier(), r.GetTokenCost()}
}

type denyEntry struct {
	until time.Time
	resp  *ratelimitv1.RateLimitResponse
}

// denyCache remembers THROTTLED answers until their retry time. It holds
// at most max keys: when full, a new key looks at evictSample entries
// (map order is random), drops those expired and, if none was, the first
// it looked at (a forgotten deny costs one RPC, nothing more). A scan of
// every entry instead would hold the lock every Check takes for a scan of
// max entries on each new key while the cache is full of live denies.
type denyCache struct {
	max int
	mu  sync.Mutex
	m   map[denyKey]denyEntry
}

// evictSample is how many entries a put into a full cache looks at.
const evictSample = 32

func newDenyCache(n int) *denyCache { return &denyCache{max: n, m: make(map[denyKey]denyEntry)} }

func (d *denyCache) get(k denyKey, now time.Time) (*ratelimitv1.RateLimitResponse, bool) {
	if d.max == 0 {
		return nil, false
	}
	d.mu.Lock()
	if len(d.m) == 0 {
		d.mu.Unlock()
		return nil, false
	}
	e, ok := d.m[k]
	if ok && !now.Before(e.until) {
		delete(d.m, k)
		ok = false
	}
	d.mu.Unlock()
	if !ok {
		return nil, false
	}
	left := e.until.Sub(now)
	resp := proto.CloneOf(e.resp)
	resp.RetryAfterMs = ceilDiv(int64(left), int64(time.Millisecond))
	resp.ResetAfterSeconds = ceilDiv(int64(left), int64(time.Second))
	return resp, true
}

func (d *denyCache) put(k denyKey, resp *ratelimitv1.RateLimitResponse, now time.Time) {
	if d.max == 0 || resp.GetDecision() != ratelimitv1.RateLimitResponse_THROTTLED || resp.GetRetryAfterMs() <= 0 {
		return
	}
	until := now.Add(time.Duration(resp.GetRetryAfterMs()) * time.Millisecond)
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.m[k]; !ok && len(d.m) >= d.max {
		seen, first := 0, true
		var victim denyKey
		for k2, e := range d.m {
			if !now.Before(e.until) {
				delete(d.m, k2)
			} else if first {
				victim, first = k2, false
			}
			if seen++; seen == evictSample {
				break
			}
		}
		if len(d.m) >= d.max {
			delete(d.m, victim)
		}
	}
	d.m[k] = denyEntry{until: until, resp: proto.CloneOf(resp)} // the caller owns resp
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
