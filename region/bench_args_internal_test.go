package region

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// BenchmarkScriptArgs is the per-check CPU of laying one key out for
// check_tb.lua: the group's checks and the script arguments of a spec
// already seen (the common case: a node's checks are of a few
// policies), into a command's arguments.
func BenchmarkScriptArgs(b *testing.B) {
	var sa specArgs
	g := algorithm.Group{{Key: "allot:{t:42}:api", Spec: algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: 1000, Period: time.Second, Burst: 1000}, Cost: 1}}
	c := call{group: g}
	cmd := make([]any, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		if err := sa.checkGroup(g); err != nil {
			b.Fatal(err)
		}
		cmd = c.appendArgs(cmd[:0], &sa)
	}
}
