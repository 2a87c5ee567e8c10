package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// UsecPerCall is Redis's own time per call of cmd (INFO commandstats,
// usec_per_call): a command's or script's cost without the network and
// the client's scheduling, which dominate a benchmark's ns/op on a busy
// machine. It fails tb if Redis has no such entry (cmd never ran).
func UsecPerCall(tb testing.TB, c redis.UniversalClient, cmd string) float64 {
	tb.Helper()
	f, ok := commandStat(tb, c, cmd, "usec_per_call")
	if !ok {
		tb.Fatalf("no cmdstat_%s in INFO commandstats", cmd)
	}
	return f
}

// Calls is how many times Redis ran cmd (INFO commandstats, calls; 0 if
// it never did since the last CONFIG RESETSTAT).
func Calls(tb testing.TB, c redis.UniversalClient, cmd string) int64 {
	tb.Helper()
	f, _ := commandStat(tb, c, cmd, "calls")
	return int64(f)
}

// Usec is Redis's own time spent in cmd, in µs (INFO commandstats, usec;
// 0 if it never ran since the last CONFIG RESETSTAT).
func Usec(tb testing.TB, c redis.UniversalClient, cmd string) float64 {
	tb.Helper()
	f, _ := commandStat(tb, c, cmd, "usec")
	return f
}

func commandStat(tb testing.TB, c redis.UniversalClient, cmd, stat string) (float64, bool) {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, stat+"="); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					tb.Fatal(err)
				}
				return f, true
			}
		}
	}
	return 0, false
}
