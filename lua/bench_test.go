package lua_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/lua"
)

// BenchmarkCheckScript is one EVALSHA of a one-key token-bucket check
// from a plain go-redis client, without package region's pipeline, so
// that redis-µs/call (Redis' own usec_per_call of EVALSHA) is the
// script's cost with as little client activity beside it as this
// machine allows. Every call is admitted.
func BenchmarkCheckScript(b *testing.B) {
	for _, tc := range []struct {
		name string
		s    *redis.Script
	}{{"check.lua", lua.Check}, {"check_tb.lua", lua.CheckTB}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			c := redis.NewClient(&redis.Options{Addr: redistest.Server(b).Addr})
			b.Cleanup(func() { _ = c.Close() })
			keys, args := []string{"rl:{bench}:tb"}, []any{"tb", 1_000_000, 1000, 1_000_000, 1}
			if err := tc.s.Run(ctx, c, keys, args...).Err(); err != nil { // loads the script
				b.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := tc.s.EvalSha(ctx, c, keys, args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(redistest.UsecPerCall(b, c, "evalsha"), "redis-µs/call")
			b.ReportMetric(redistest.UsecPerCall(b, c, "hmget")+redistest.UsecPerCall(b, c, "hset")+redistest.UsecPerCall(b, c, "pexpire")+redistest.UsecPerCall(b, c, "time"), "commands-µs/call")
		})
	}
}
