package coord

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// hotKeys builds n report entries with realistic keys: a per-tenant
// global limit, rl:{tenant=t-000042}:api-global:rps.
func hotKeys(n int) []entry {
	es := make([]entry, n)
	for i := range es {
		es[i] = entry{key: fmt.Sprintf("rl:{tenant=t-%06d}:api-global:rps", i), rate: float32(100 + i%900), weight: float32(100 + i%700), share: rebalance.Share(1e8 + i)}
	}
	return es
}

// quotaKeys builds n quota entries: a per-tenant global daily quota,
// rl:{tenant=t-000042}:api-daily:req, counted in today's window.
func quotaKeys(n int) []entry {
	es := make([]entry, n)
	day := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixNano() / int64(24*time.Hour)
	for i := range es {
		es[i] = entry{key: fmt.Sprintf("rl:{tenant=t-%06d}:api-daily:req", i), window: day, used: uint64(1000 + i%50_000)}
	}
	return es
}

var benchLimits = StaticLimits{"api-global:rps": {Rate: 3000, Burst: 3000}}

// BenchmarkReport measures one region's report per interval: its encoded
// size (B/report), chunks under a 1 MiB NATS max payload, and the time to
// encode it.
func BenchmarkReport(b *testing.B) {
	for _, c := range []struct {
		kind string
		gen  func(int) []entry
	}{{"rate", hotKeys}, {"quota", quotaKeys}} {
		for _, n := range []int{1_000, 100_000} {
			benchReport(b, c.kind, n, c.gen(n))
		}
	}
}

func benchReport(b *testing.B, kind string, n int, es []entry) {
	b.Run(fmt.Sprintf("%s/keys=%d", kind, n), func(b *testing.B) {
		var bytes, chunks int
		for b.Loop() {
			msgs := encodeReport("eu-west-1", roundID{179599367, 10000, false}, es, 1<<20)
			bytes, chunks = 0, len(msgs)
			for _, m := range msgs {
				bytes += proto.Size(m)
			}
		}
		b.ReportMetric(float64(bytes), "B/report")
		b.ReportMetric(float64(bytes)/float64(n), "B/key")
		b.ReportMetric(float64(chunks), "chunks")
	})
}

// hotWire is the reports of round id from ap and us, n hot keys each, as
// they travel.
func hotWire(id roundID, n int) [][]byte {
	var msgs []*coordv1.Message
	for _, r := range []string{"ap", "us"} {
		msgs = append(msgs, encodeReport(r, id, hotKeys(n), 1<<20)...)
	}
	wire := make([][]byte, len(msgs))
	for i, m := range msgs {
		wire[i], _ = proto.Marshal(m)
	}
	return wire
}

// BenchmarkEpochCPU measures the coordinator's own CPU per interval for n
// hot keys in 3 regions: decoding the two other reports (from the wire), planning every
// key and listing the share updates of both phases (no network, no Redis).
// The largest size is the scale one coordinator must keep up with: one
// epoch's CPU well under its interval.
func BenchmarkEpochCPU(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			regions := []string{"ap", "eu", "us"}
			k := DefaultKnobs()
			mine := hotKeys(n)
			wire := hotWire(roundID{1, k.Interval.Milliseconds(), false}, n)
			c, err := NewMachine(MachineConfig{Region: "eu", Regions: regions, Limits: benchLimits})
			if err != nil {
				b.Fatal(err)
			}
			c.Tick(time.UnixMilli(k.Interval.Milliseconds()))
			for b.Loop() {
				clear(c.inbox.rounds)
				for _, w := range wire {
					c.inbox.fileWire(w, c.clock.now) // as NATSTransport delivers it
				}
				r := c.inbox.roundOrEmpty(roundID{1, k.Interval.Milliseconds(), false}, c.clock.now)
				heard := c.inbox.heard(r)
				if len(heard) != len(regions) {
					b.Fatalf("heard %v, want every region", heard)
				}
				plans := c.planner.plan(r, mine, heard, c.inbox.last, k)
				c.ledger.updates(plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Shrunk[kp.Self] }, k, true)
				c.ledger.updates(plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Grow(true) }, k, false)
			}
		})
	}
}

// BenchmarkMidRoundCPU is BenchmarkEpochCPU for a mid-interval round in
// which every key moved in every region (its worst case: a quiet round
// plans nothing): decode the two other mid reports, plan every key from
// them with the epoch's reports behind, list both phases' updates.
func BenchmarkMidRoundCPU(b *testing.B) {
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			regions := []string{"ap", "eu", "us"}
			k := DefaultKnobs()
			id := roundID{1, k.Interval.Milliseconds(), true}
			wire := hotWire(id, n)
			c, err := NewMachine(MachineConfig{Region: "eu", Regions: regions, Limits: benchLimits})
			if err != nil {
				b.Fatal(err)
			}
			c.Tick(time.UnixMilli(k.Interval.Milliseconds() * 3 / 2))
			c.reports.base = midBase{epoch: 1, all: true, mine: hotKeys(n)}
			for _, r := range []string{"ap", "us"} {
				c.inbox.last[r] = hotKeys(n)
			}
			e := &epoch{id: id, k: k, mine: hotKeys(n)}
			for b.Loop() {
				clear(c.inbox.rounds)
				for _, w := range wire {
					c.inbox.fileWire(w, c.clock.now)
				}
				e.r = c.inbox.roundOrEmpty(id, c.clock.now)
				if len(c.inbox.missingReports(e.r)) != 0 {
					b.Fatal("the other regions' mid reports are not complete")
				}
				plans := c.planner.midPlan(e, c.reports.base.mine, c.inbox.last, c.ledger.own)
				if len(plans.keys) != n {
					b.Fatalf("planned %d keys, want %d", len(plans.keys), n)
				}
				c.ledger.updates(plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Shrunk[kp.Self] }, k, false)
				c.ledger.updates(plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Grow(true) }, k, false)
			}
		})
	}
}
