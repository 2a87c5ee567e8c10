package client

import (
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// live's one-key fast path (quota.last) answers only while the key is
// what the map holds: an abandoned key is checked by RPC at once, though
// its assignment had time left and it was the last key found.
func TestLastKeyEndsWithAbandon(t *testing.T) {
	now := time.Now().UnixNano()
	q := &quota{keys: map[denyKey]*qkey{}, warm: map[denyKey]int32{}, unbatchable: map[denyKey]int64{},
		now: func() int64 { return now }}
	req := &ratelimitv1.RateLimitRequest{TenantId: "t", Route: "/r"}
	k := keyOf(req)
	b := &qkey{id: bucketID(req), key: k}
	b.kind.Store(kindAllow)
	b.expires.Store(now + int64(time.Minute))
	q.keys[k] = b
	if q.live(k, req, now) != b || q.last.Load() != b {
		t.Fatal("a live key is not found, or not kept as the last")
	}
	other := &ratelimitv1.RateLimitRequest{TenantId: "u"}
	if q.live(keyOf(other), other, now) != nil {
		t.Fatal("another identity answered by the last key")
	}
	q.apply(&rlqsv3.RateLimitQuotaResponse{BucketAction: []*rlqsv3.RateLimitQuotaResponse_BucketAction{{
		BucketId:     &rlqsv3.BucketId{Bucket: b.id},
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}}})
	if got := q.live(k, req, now); got != nil {
		t.Fatal("an abandoned key is still decided in process")
	}
}
