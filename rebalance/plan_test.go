package rebalance

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPlanIsDeterministicRegardlessOfInputOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 10))
	for range 5000 {
		n := 1 + r.IntN(6)
		regions := make([]Region, n)
		ds := randomDemands(r, n, 1000)
		for i := range regions {
			regions[i] = Region{Name: fmt.Sprintf("r%d", i), Heard: r.IntN(4) != 0, Demand: ds[i], Share: Share(r.Int64N(int64(Unit) / int64(n)))}
		}
		self := regions[r.IntN(n)].Name
		regions[slices.IndexFunc(regions, func(x Region) bool { return x.Name == self })].Heard = true
		p := Params{Floor: r.Float64(), Decay: r.Float64()}
		a := Plan(self, regions, 1000, p)
		shuffled := slices.Clone(regions)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		b := Plan(self, shuffled, 1000, p)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("order changed the plan:\n%v\n%v", a, b)
		}
		group := r.IntN(2) == 0
		if a.Grow(group) != b.Grow(group) {
			t.Fatal("order changed Grow")
		}
	}
}

func TestFullViewConvergesInOneEpoch(t *testing.T) {
	names := []string{"eu", "us", "ap"}
	prev := []Share{Default(3), Default(3), Default(3)}
	ds := []Demand{{Rate: 360, Weight: 360}, {Rate: 20, Weight: 20}, {Rate: 20, Weight: 20}}
	p := Params{Floor: 0.1, Decay: 0.5}
	for i, self := range names {
		regions := make([]Region, 3)
		for j := range names {
			regions[j] = Region{Name: names[j], Heard: true, Demand: ds[j], Share: prev[j]}
		}
		kp := Plan(self, regions, 300, p)
		got := kp.Grow(true)
		want := Fair(Unit, 300, FloorShare(3, 0.1), []Demand{ds[2], ds[0], ds[1]}) // sorted: ap, eu, us
		idx := map[string]int{"ap": 0, "eu": 1, "us": 2}[self]
		if got != want[idx] {
			t.Errorf("%s (%d): got %d, want %d", self, i, got, want[idx])
		}
	}
}

func TestIsolatedRegionOnlyShrinksTowardFair(t *testing.T) {
	p := Params{Floor: 0.1, Decay: 0.5}
	fair := Default(3)
	big := Share(800_000_000)
	regions := []Region{
		{Name: "eu", Heard: true, Demand: Demand{Rate: 1e9, Weight: 1e9}, Share: big},
		{Name: "us", Share: 100_000_000},
		{Name: "ap", Share: 100_000_000},
	}
	kp := Plan("eu", regions, 300, p)
	got := kp.Grow(true)
	if want := big - Share((float64(big-fair))*0.5+0.5); got != want && got != want+1 {
		t.Fatalf("isolated big region: got %d, want about %d", got, want)
	}
	small := []Region{{Name: "eu", Heard: true, Demand: Demand{Rate: 1e9}, Share: 100_000_000}, {Name: "us", Share: 450_000_000}, {Name: "ap", Share: 450_000_000}}
	if got := Plan("eu", small, 300, p).Grow(true); got != 100_000_000 {
		t.Fatalf("isolated small region grew or shrank: %d", got)
	}
}

// TestPlanIntoReusedIsPlan: a KeyPlan reused for key after key, of any
// number of regions, heard or not, holds nothing of the keys before.
func TestPlanIntoReusedIsPlan(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 11))
	var kp KeyPlan
	for range 5000 {
		n := 1 + r.IntN(6)
		regions := make([]Region, n)
		ds := randomDemands(r, n, 1000)
		for i := range regions {
			regions[i] = Region{Name: fmt.Sprintf("r%d", i), Heard: r.IntN(3) != 0, Demand: ds[i], Share: Share(r.Int64N(int64(Unit) / int64(n)))}
		}
		self := regions[r.IntN(n)].Name
		p := Params{Floor: r.Float64(), Decay: r.Float64(), Headroom: r.Float64() / 4}
		PlanInto(&kp, self, regions, 1000, p)
		if want := Plan(self, regions, 1000, p); fmt.Sprint(kp) != fmt.Sprint(want) {
			t.Fatalf("reused plan:\n%v\nfresh plan:\n%v", kp, want)
		}
	}
}
