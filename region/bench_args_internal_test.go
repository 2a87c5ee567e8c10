package region

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// BenchmarkScriptArgs is the per-check CPU of laying one key out for
// check_tb.lua: the script arguments of a spec already seen (the common
// case: a node's checks are of a few policies).
func BenchmarkScriptArgs(b *testing.B) {
	var sa specArgs
	g := algorithm.Group{{Key: "allot:{t:42}:api", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}, Cost: 1}}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := sa.scriptArgs(g); err != nil {
			b.Fatal(err)
		}
	}
}
