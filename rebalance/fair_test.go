package rebalance

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// seed fixes every randomized table, so a failure reproduces.
const seed = 20260601

func randomDemands(r *rand.Rand, m int, limit float64) []Demand {
	ds := make([]Demand, m)
	for i := range ds {
		switch r.IntN(4) {
		case 0: // idle
		case 1: // small
			ds[i].Rate = r.Float64() * limit * 0.05
		default:
			ds[i].Rate = r.Float64() * limit * 1.5
		}
		ds[i].Weight = Smooth(r.Float64()*limit, ds[i].Rate, 0.5)
	}
	return ds
}

func sum(s []Share) int64 {
	var t int64
	for _, v := range s {
		t += int64(v)
	}
	return t
}

func TestFairSumsToPoolAndHonoursFloors(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 1))
	for range 20000 {
		m := 1 + r.IntN(6)
		limit := 1 + r.Float64()*1e6
		floor := FloorShare(m, r.Float64())
		pool := Unit
		if r.IntN(3) == 0 {
			pool = Share(r.Int64N(int64(Unit)))
		}
		ds := randomDemands(r, m, limit)
		x := Fair(pool, limit, floor, ds)
		s := sum(x)
		if s > int64(pool) {
			t.Fatalf("Fair(%d, %v, %d, %v) = %v: sum %d > pool", pool, limit, floor, ds, x, s)
		}
		// Rounding down loses less than one unit per region.
		if s < int64(pool)-int64(m) {
			t.Fatalf("Fair(%d, ...) = %v: sum %d loses more than rounding", pool, x, s)
		}
		if int64(pool) > int64(m)*int64(floor) {
			for i, v := range x {
				if v < floor {
					t.Fatalf("region %d got %d under floor %d (%v)", i, v, floor, x)
				}
			}
		}
	}
}

func TestFairServesEveryRegionUnderTheLevelInFull(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 2))
	for range 20000 {
		m := 1 + r.IntN(6)
		limit := 1000.0
		ds := randomDemands(r, m, limit)
		x := Fair(Unit, limit, FloorShare(m, 0.1), ds)
		var top Share
		for _, v := range x {
			top = max(top, v)
		}
		for i, d := range ds {
			need := d.Rate / limit * float64(Unit)
			// A region that did not get its demand is at the level, which is
			// the largest share: nobody with less demand was favoured.
			if float64(x[i])+1 < need && x[i]+1 < top {
				t.Fatalf("region %d demand %.0f got %d while another got %d: %v / %v", i, need, x[i], top, ds, x)
			}
		}
	}
}

func TestFairIsMonotoneInOwnDemand(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 3))
	for range 20000 {
		m := 1 + r.IntN(6)
		limit := 1 + r.Float64()*1e5
		ds := randomDemands(r, m, limit)
		prevW := make([]float64, m)
		for i := range prevW {
			prevW[i] = r.Float64() * limit
			ds[i].Weight = Smooth(prevW[i], ds[i].Rate, 0.5)
		}
		floor := FloorShare(m, r.Float64()*0.5)
		i := r.IntN(m)
		before := Fair(Unit, limit, floor, ds)
		more := slices.Clone(ds)
		more[i].Rate += r.Float64() * limit
		more[i].Weight = Smooth(prevW[i], more[i].Rate, 0.5)
		after := Fair(Unit, limit, floor, more)
		// One unit of slack for rounding down a float that moved by an ulp.
		if int64(after[i])+1 < int64(before[i]) {
			t.Fatalf("more demand for region %d: %d -> %d\n%v\n%v", i, before[i], after[i], ds, more)
		}
	}
}

func TestFairExamples(t *testing.T) {
	const L = 300.0
	for _, tc := range []struct {
		name  string
		rates []float64
		want  []float64 // fractions of L, ±1 unit
	}{
		// The traffic moved: 90% of 400/s to one region.
		{"shifted", []float64{360, 20, 20}, []float64{260.0 / 300, 20.0 / 300, 20.0 / 300}},
		// Even and over-subscribed: a third each.
		{"even", []float64{200, 200, 200}, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}},
		// Doorman's example (capacity 120; wants 1000, 50, 10): max-min
		// gives 60, 50, 10 like FAIR_SHARE.
		{"doorman", []float64{1000, 50, 10}, []float64{60.0 / 120, 50.0 / 120, 10.0 / 120}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := L
			if tc.name == "doorman" {
				limit = 120
			}
			ds := make([]Demand, len(tc.rates))
			for i, v := range tc.rates {
				ds[i] = Demand{Rate: v, Weight: v}
			}
			x := Fair(Unit, limit, 0, ds)
			for i, w := range tc.want {
				if d := float64(x[i]) - w*float64(Unit); d > 1 || d < -2 {
					t.Errorf("region %d: got %d, want %.0f", i, x[i], w*float64(Unit))
				}
			}
		})
	}
}

func TestFairSplitsSpareByWeight(t *testing.T) {
	// Under-subscribed: everyone gets its demand and the spare follows the
	// smoothed demand.
	x := Fair(Unit, 1000, 0, []Demand{{Rate: 100, Weight: 300}, {Rate: 100, Weight: 100}, {}})
	want := []Share{100_000_000 + 600_000_000, 100_000_000 + 200_000_000, 0}
	for i := range want {
		if d := int64(x[i]) - int64(want[i]); d > 1 || d < -1 {
			t.Fatalf("got %v, want %v", x, want)
		}
	}
}

func ExampleFair() {
	// 90% of 400 tokens/s moved to the first region of a 300/s global
	// limit; the others keep 10% of their fair share as a floor.
	x := Fair(Unit, 300, FloorShare(3, 0.1), []Demand{{Rate: 360}, {Rate: 20}, {Rate: 20}})
	for _, s := range x {
		fmt.Printf("%.1f/s\n", s.Of(300))
	}
	// Output:
	// 260.0/s
	// 20.0/s
	// 20.0/s
}
