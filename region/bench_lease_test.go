package region_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// BenchmarkLeaseScript is one lease.lua call (one group of one key,
// need 1, want 10) at concurrency 1 against a local redis-server, like
// BenchmarkScriptPerAlgorithm: ns/op with the round trip, and Redis' own
// time executing the script (redis-µs/call). Every call grants.
func BenchmarkLeaseScript(b *testing.B) {
	ctx := context.Background()
	s, err := region.Open(ctx, []string{redistest.Server(b).Addr}, region.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	groups := []lease.Group{{{Key: "rl:{bench}:lease", Spec: tb(1_000_000_000, time.Second, 0), Need: 1, Want: 10}}}
	if _, err := s.Lease(ctx, groups); err != nil { // loads the script
		b.Fatal(err)
	}
	if err := s.Client().ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := s.Lease(ctx, groups)
		if err != nil || res[0].Err != nil || !res[0].Granted {
			b.Fatal(err, res)
		}
	}
	b.ReportMetric(redistest.UsecPerCall(b, s.Client(), "evalsha"), "redis-µs/call")
}
