package lua_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/internal/testenv/luatest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lua"
)

// BenchmarkCheckScript is one EVALSHA of a one-key token-bucket check
// from a plain go-redis client, without package region's pipeline, so
// that redis-µs/call (Redis' own usec_per_call of EVALSHA) is the
// script's cost with as little client activity beside it as this
// machine allows. Every call is admitted. check_tb.lua runs one group
// per call here, as a node's lone check does; BenchmarkCheckTBGroups has
// the shared calls.
func BenchmarkCheckScript(b *testing.B) {
	tbKeys, tbArgs := luatest.CheckTBGroups([][]string{{"rl:{bench}:tb"}}, [][]any{{"tb", 1_000_000, 1000, 1_000_000, 1}})
	for _, tc := range []struct {
		name string
		s    *redis.Script
		keys []string
		args []any
	}{
		{"check.lua", lua.Check, []string{"rl:{bench}:tb"}, []any{"tb", 1_000_000, 1000, 1_000_000, 1}},
		{"check_tb.lua", lua.CheckTB, tbKeys, tbArgs},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			c := redis.NewClient(&redis.Options{Addr: redistest.Server(b).Addr})
			b.Cleanup(func() { _ = c.Close() })
			if err := tc.s.Run(ctx, c, tc.keys, tc.args...).Err(); err != nil { // loads the script
				b.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := tc.s.EvalSha(ctx, c, tc.keys, tc.args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(redistest.UsecPerCall(b, c, "evalsha"), "redis-µs/call")
			b.ReportMetric(redistest.UsecPerCall(b, c, "hmget")+redistest.UsecPerCall(b, c, "hset")+redistest.UsecPerCall(b, c, "pexpire")+redistest.UsecPerCall(b, c, "time"), "commands-µs/call")
		})
	}
}

// BenchmarkCheckTBGroups is check_tb.lua carrying g one-key groups per
// call, as a node sends the checks that queued for a shard while its
// pipelines were in flight: redis-µs/group is Redis' usec_per_call of
// EVALSHA divided by g, the script's cost per check. Each op is one call
// (g checks) on g keys of 10,000.
func BenchmarkCheckTBGroups(b *testing.B) {
	for _, g := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("groups=%d", g), func(b *testing.B) {
			ctx := context.Background()
			c := redis.NewClient(&redis.Options{Addr: redistest.Server(b).Addr})
			b.Cleanup(func() { _ = c.Close() })
			calls := make([][2][]any, 0, 64)
			for n := range 10_000 / g {
				keys, args := make([][]string, g), make([][]any, g)
				for i := range g {
					keys[i] = []string{fmt.Sprintf("rl:{t%d}:tb", n*g+i)}
					args[i] = []any{"tb", 1_000_000, 1000, 1_000_000, 1}
				}
				k, a := luatest.CheckTBGroups(keys, args)
				ka := make([]any, len(k))
				for i := range k {
					ka[i] = k[i]
				}
				calls = append(calls, [2][]any{ka, a})
			}
			run := func(i int) error {
				ka := calls[i%len(calls)]
				keys := make([]string, len(ka[0]))
				for j, k := range ka[0] {
					keys[j] = k.(string)
				}
				return lua.CheckTB.EvalSha(ctx, c, keys, ka[1]...).Err()
			}
			if err := lua.CheckTB.Load(ctx, c).Err(); err != nil {
				b.Fatal(err)
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			i := 0
			for b.Loop() {
				if err := run(i); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(redistest.UsecPerCall(b, c, "evalsha")/float64(g), "redis-µs/group")
		})
	}
}
