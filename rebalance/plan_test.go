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

// TestNoPartitionScheduleOversubscribes simulates regions running the
// two-phase protocol under random partitions, lost acknowledgements and
// random interleavings of the regions' steps, and checks after every single
// step that the shares in force sum to at most Unit. Afterwards the links
// heal and the shares must reach the fair target within two epochs.
func TestNoPartitionScheduleOversubscribes(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 20))
	p := Params{Floor: 0.1, Decay: 0.3}
	for run := range 300 {
		n := 2 + r.IntN(4)
		sim := newSim(n)
		for epoch := range 30 {
			sim.epoch(t, r, p, run, epoch, false)
		}
		// Heal: two clean epochs with constant demand reach the target.
		demand := sim.randomDemand(r)
		for range 2 {
			sim.demand = demand
			sim.epoch(t, r, p, run, -1, true)
		}
		target := Fair(Unit, sim.limit, FloorShare(n, p.Floor), sim.demand)
		for i := range n {
			if d := int64(sim.share[i]) - int64(target[i]); d > 1 || d < -1 {
				t.Fatalf("run %d: after healing region %d has %d, target %d (%v vs %v)", run, i, sim.share[i], target[i], sim.share, target)
			}
		}
	}
}

type sim struct {
	n      int
	limit  float64
	names  []string
	share  []Share   // in force in each region's Redis
	last   [][]Share // last[i][j]: the share region i last heard from j
	demand []Demand
}

func newSim(n int) *sim {
	s := &sim{n: n, limit: 1000, names: make([]string, n), share: make([]Share, n), last: make([][]Share, n)}
	for i := range n {
		s.names[i] = fmt.Sprintf("r%d", i) // sorted order = index order
		s.share[i] = Default(n)
		s.last[i] = make([]Share, n)
		for j := range n {
			s.last[i][j] = Default(n)
		}
	}
	return s
}

func (s *sim) randomDemand(r *rand.Rand) []Demand { return randomDemands(r, s.n, s.limit) }

func (s *sim) check(t *testing.T, what string) {
	t.Helper()
	if got := sum(s.share); got > int64(Unit) {
		t.Fatalf("%s: shares in force %v sum to %d > %d", what, s.share, got, Unit)
	}
}

func (s *sim) epoch(t *testing.T, r *rand.Rand, p Params, run, epoch int, healed bool) {
	t.Helper()
	n := s.n
	if !healed {
		s.demand = s.randomDemand(r)
	}
	// hears[i][j]: region i got j's complete report this epoch.
	hears := make([][]bool, n)
	for i := range n {
		hears[i] = make([]bool, n)
		for j := range n {
			hears[i][j] = i == j || healed || r.IntN(3) != 0
		}
	}
	// Reports carry the share in force when they are sent.
	plans := make([]KeyPlan, n)
	for i := range n {
		regions := make([]Region, n)
		for j := range n {
			regions[j] = Region{Name: s.names[j], Heard: hears[i][j], Share: s.last[i][j]}
			if hears[i][j] {
				regions[j].Demand, regions[j].Share = s.demand[j], s.share[j]
				s.last[i][j] = s.share[j]
			}
		}
		plans[i] = Plan(s.names[i], regions, s.limit, p)
	}
	// Phase 1 and 2 events in a random order; a region's phase 2 waits for
	// the acks it needs, and gives up on growing if one was lost.
	acked := make([]bool, n)
	done1, done2 := make([]bool, n), make([]bool, n)
	ackLost := make([][]bool, n)
	for i := range n {
		ackLost[i] = make([]bool, n)
		for j := range n {
			ackLost[i][j] = !healed && i != j && r.IntN(5) == 0
		}
	}
	for steps := 0; steps < 2*n; {
		i := r.IntN(n)
		switch {
		case !done1[i]:
			s.share[i] = plans[i].Shrunk[i]
			acked[i], done1[i] = true, true
			s.check(t, fmt.Sprintf("run %d epoch %d: %s shrinks", run, epoch, s.names[i]))
			steps++
		case !done2[i]:
			group, waiting := true, false
			for j := range n {
				if !plans[i].Heard[j] {
					continue
				}
				if !acked[j] {
					waiting = true
				}
				if ackLost[i][j] || !slices.Equal(plans[j].Heard, plans[i].Heard) {
					group = false
				}
			}
			if waiting && group {
				continue // a later event delivers the ack
			}
			s.share[i] = plans[i].Grow(group)
			done2[i] = true
			s.check(t, fmt.Sprintf("run %d epoch %d: %s grows (group %v)", run, epoch, s.names[i], group))
			steps++
		}
	}
}
