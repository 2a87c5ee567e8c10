package coord

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// schedules is how many random histories the property test explores.
const schedules = 10_000

const propKey2 = "rl:{tenant=beta}:global:rps"

// schedule is one random history: regions, clock skews, and for each
// segment of the chaos phase the cut links, the message faults, the
// failing writers and the demand.
type schedule struct {
	seed uint64
	r    *rand.Rand
	n    *vnet
	k    Knobs
	keys []string
	// Per segment.
	cut                  map[[2]string]bool
	drop, dup, late      float64
	maxDelay, lateDelay  time.Duration
	segments, healEpochs int
}

// newSchedule builds history seed: 2 to 4 regions, one or two keys.
func newSchedule(seed uint64) *schedule {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	regions := []string{"r0", "r1", "r2", "r3"}[:2+r.IntN(3)]
	k := DefaultKnobs()
	k.Interval = 100 * time.Millisecond
	// Half the histories run production's 10 s interval, which has
	// mid-interval rounds (too short an interval has none). The draw has
	// its own source, so that the other draws, and the seeds cited below,
	// are those of the 100 ms histories before mid-interval rounds.
	if rand.New(rand.NewPCG(seed, 0x1d)).IntN(2) == 0 {
		k.Interval = 10 * time.Second
	}
	k.Gather = 0.1 + 0.3*r.Float64()
	k.HeavyHitter = 0 // every key with demand travels: the convergence check knows every input
	k.Smoothing = 1
	k.Decay = r.Float64()
	k.Floor = 0.2 * r.Float64()
	k.ShareTTL = max(time.Second, 2*k.Interval)
	s := &schedule{seed: seed, r: r, n: newVnet(nil, regions...), k: k, keys: []string{testKey, propKey2}[:1+r.IntN(2)]}
	for _, name := range regions {
		mb := s.n.add(name, name, k, 0, discard)
		mb.skew = time.Duration(r.IntN(5_000)) * time.Microsecond // NTP-grade clocks
	}
	s.n.deliver = s.deliver
	s.segments = 2 + r.IntN(4)
	s.healEpochs = 3
	return s
}

// deliver is the fault model of the chaos phase: cut links drop all; a
// message is lost, duplicated or late (up to two intervals: acks and
// reports of an epoch arriving after its phases ended) at random, and
// otherwise delayed by a random trip, which reorders messages.
func (s *schedule) deliver(from, to *member, _ *coordv1.Message) []time.Duration {
	if s.cut[[2]string{from.region, to.region}] || s.r.Float64() < s.drop {
		return nil
	}
	trip := func() time.Duration {
		if s.r.Float64() < s.late {
			return s.k.Interval/4 + time.Duration(s.r.Int64N(int64(s.lateDelay)))
		}
		return time.Millisecond + time.Duration(s.r.Int64N(int64(s.maxDelay)))
	}
	out := []time.Duration{trip()}
	if s.r.Float64() < s.dup {
		out = append(out, trip())
	}
	return out
}

// run plays the chaos phase, heals, and returns the first violation of
// Theorem 1 or of convergence ("" if none).
func (s *schedule) run() string {
	r, n := s.r, s.n
	regions := n.regions
	for seg := range s.segments {
		s.cut = map[[2]string]bool{}
		pc := []float64{0, 0.2, 0.5}[r.IntN(3)]
		for _, a := range regions {
			for _, b := range regions {
				if a != b && r.Float64() < pc {
					s.cut[[2]string{a, b}] = true // one-way cuts too
				}
			}
			n.globalLedger.fail[a] = r.IntN(6) == 0
		}
		s.drop, s.dup, s.late = 0.3*r.Float64(), 0.3*r.Float64(), 0.3*r.Float64()
		s.maxDelay = time.Duration(1+r.IntN(40)) * time.Millisecond
		s.lateDelay = 2 * s.k.Interval
		for _, key := range s.keys {
			rates := make([]float64, len(regions))
			for i := range rates {
				rates[i] = 1 + 600*r.Float64()*r.Float64()
			}
			n.setDemand(key, rates...)
		}
		n.run(time.Duration(1+r.IntN(3)) * s.k.Interval)
		if len(n.globalLedger.violations) > 0 {
			return fmt.Sprintf("segment %d: %s", seg, n.globalLedger.violations[0])
		}
	}
	// Heal: every link up, no faults, constant demand.
	s.cut = nil
	s.drop, s.dup, s.late, s.maxDelay = 0, 0, 0, time.Millisecond
	clear(n.globalLedger.fail)
	want := map[string][]float64{}
	for _, key := range s.keys {
		rates := make([]float64, len(regions))
		for i := range rates {
			rates[i] = 1 + 600*r.Float64()
		}
		n.setDemand(key, rates...)
		want[key] = rates
	}
	n.run(time.Duration(s.healEpochs) * s.k.Interval)
	if len(n.globalLedger.violations) > 0 {
		return "after healing: " + n.globalLedger.violations[0]
	}
	// Convergence: every region holds its fair target over all regions.
	// With every region heard the target does not depend on the shares
	// before, so it is Plan's Target for the true demand.
	params := rebalance.Params{Floor: s.k.Floor, Decay: s.k.Decay, Headroom: s.k.Headroom}
	for _, key := range s.keys {
		rs := make([]rebalance.Region, len(regions))
		for i, name := range regions {
			d := float64(float32(want[key][i]))
			rs[i] = rebalance.Region{Name: name, Heard: true, Demand: rebalance.Demand{Rate: d, Weight: d}, Share: rebalance.Default(len(regions))}
		}
		target := rebalance.Plan(regions[0], rs, testLimits["global:rps"].Rate, params).Target
		got := n.shares(key)
		for i := range regions {
			if d := int64(got[i]) - int64(target[i]); d > 1000 || d < -1000 { // 1e-6 of L: float32 demand
				return fmt.Sprintf("after healing %s: shares %v, targets %v", key, got, target)
			}
		}
	}
	return ""
}

func (s *schedule) String() string {
	return fmt.Sprintf("seed %d: %d regions, %d keys, %d segments, knobs %+v", s.seed, len(s.n.regions), len(s.keys), s.segments, s.k)
}

// TestNoScheduleOversubscribes is the property test of docs/multi-region.md
// on the real Machine: 10,000 random histories of 2 to 4 regions (clock
// skews, one-way and two-way partitions, lost, duplicated, reordered and
// late messages, failing writes, moving demand), each checking Theorem 1
// (the shares in force never sum past L: the global ledger checks every single
// write) and then, after the links heal, convergence to the fair target
// within three epochs.
//
// The test can fail. TestBrokenGrowIsCaught runs the same schedules with
// machines that grow without waiting for the group's acks (each is handed
// forged ones) and requires a violation: seed 1 finds it,
//
//	after healing: after r1 wrote rl:{tenant=acme}:global:rps=627333980
//	the shares in force sum to 1127333980 > 1000000000
//
// Breaking the group rule in inbox.group fails this test too (run by
// hand, 2026-12-01): accepting acks of a different heard set fails at seed
// 1 ("after r1 wrote ...=609587979 the shares in force sum to 1109587979"),
// accepting acks of failed shrinks at seed 45 ("... sum to 1077354701").
// Two mutations of KeyPlan.Grow's arithmetic are not caught, and cannot
// be: dropping the proportional cut (own + want) and counting
// Unit − Σ prev without a full view change nothing, because Plan's pool
// (Σ_H prev when some region is unheard) already bounds Σ want by the
// group's own releases; the safety lives in the pool and the group rule.
func TestNoScheduleOversubscribes(t *testing.T) {
	// The schedules are independent: one shard per CPU.
	shards := uint64(runtime.GOMAXPROCS(0))
	for w := range shards {
		t.Run(fmt.Sprintf("shard%d", w), func(t *testing.T) {
			t.Parallel()
			for seed := w; seed < schedules; seed += shards {
				s := newSchedule(seed)
				if v := s.run(); v != "" {
					t.Fatalf("%v: %s", s, v)
				}
			}
		})
	}
}

// TestBrokenGrowIsCaught shows the property test is not vacuous: a region
// that grows without waiting for the group's acks (the "apply at the epoch
// boundary" scheme of Theorem 2's comparison) breaks Theorem 1, and some
// schedule finds it.
func TestBrokenGrowIsCaught(t *testing.T) {
	for seed := range uint64(schedules) {
		s := newSchedule(seed)
		s.n.meddle = growWithoutAcks
		if v := s.run(); strings.Contains(v, "sum to") {
			t.Logf("caught at %v: %s", s, v)
			return
		}
	}
	t.Fatal("no schedule caught a grow step that ignores the acks")
}

// growWithoutAcks is TestBrokenGrowIsCaught's broken machine, made from
// the outside: once m gathers the acks of a round, it is handed one from
// every heard region, each acknowledging m's own view, and moves on at
// once, as a machine would that did not wait for (or read) the real ones.
func growWithoutAcks(m *Machine) {
	e := m.ep
	if e == nil || e.stage != stageAcks {
		return
	}
	for _, name := range e.heard {
		e.r.acks[name] = &coordv1.Ack{Heard: e.heard, Ok: true}
	}
	m.advance()
}

// TestSameInputsSameOutputs runs schedules twice: every Ready of every
// machine is identical, byte for byte (the machines' maps are iterated in
// a different random order each run).
func TestSameInputsSameOutputs(t *testing.T) {
	for seed := range uint64(20) {
		var a, b []string
		s := newSchedule(seed)
		s.n.trace = func(l string) { a = append(a, l) }
		va := s.run()
		s = newSchedule(seed)
		s.n.trace = func(l string) { b = append(b, l) }
		vb := s.run()
		require.Equal(t, va, vb)
		require.NotEmpty(t, a)
		require.Equal(t, len(a), len(b), "seed %d: trace lengths", seed)
		for i := range a {
			require.Equal(t, a[i], b[i], "seed %d: Ready %d differs", seed, i)
		}
	}
}
