package coord

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// mixedEntries is a report of rate and quota entries whose keys share
// prefixes of every length, some of them not ASCII.
func mixedEntries(n int) []entry {
	es := make([]entry, n)
	for i := range es {
		key := fmt.Sprintf("rl:{tenant=t-%d}:api-global:rps", i*7919%n)
		if i%5 == 0 {
			key = fmt.Sprintf("rl:{région=%d}:über:req", i)
		}
		es[i] = entry{key: key, rate: float32(i) / 3, weight: float32(i) / 7, share: rebalance.Share(i * 1000)}
		if i%4 == 0 {
			es[i] = entry{key: key + "-q", window: int64(i), used: uint64(i * i)}
		}
	}
	return es
}

// TestReportAssemblesInChunkOrder: chunks arriving in any order give the
// report in key order, and a key given twice keeps its last entry.
func TestReportAssemblesInChunkOrder(t *testing.T) {
	es := mixedEntries(500)
	msgs := encodeReport("eu", 1, 1000, slices.Clone(es), 2048)
	want := slices.Clone(es)
	slices.SortFunc(want, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		a := &assembly{chunks: uint32(len(msgs)), parts: map[uint32][]*coordv1.Entry{}}
		for _, i := range r.Perm(len(msgs)) {
			if a.complete() {
				t.Fatal("complete before its last chunk")
			}
			a.add(uint32(i), msgs[i].GetReport().GetEntries())
		}
		if !a.complete() || !slices.Equal(a.keyed, want) {
			t.Fatal("the assembled report is not the sorted entries")
		}
	}
	dup := []entry{{key: "b", rate: 1}, {key: "a", rate: 2}, {key: "b", rate: 3}, {key: "a", rate: 4}}
	if got := byKey(dup); !slices.Equal(got, []entry{{key: "a", rate: 4}, {key: "b", rate: 3}}) {
		t.Fatalf("byKey(%v) = %v", dup, got)
	}
}
