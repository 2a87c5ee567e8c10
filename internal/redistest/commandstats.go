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
			if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					tb.Fatal(err)
				}
				return f
			}
		}
	}
	tb.Fatalf("no cmdstat_%s in INFO commandstats", cmd)
	return 0
}
