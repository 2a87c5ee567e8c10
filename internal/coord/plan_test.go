package coord

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/allot-dev/allot/rebalance"
)

// TestPlanIsTheMapJoin: plan's merge of the key-ordered reports plans the
// keys, and each as, looking every key up in each region's report: in
// random rounds of keys some regions report and others not, quota counts,
// keys of no global limit, and regions heard, unheard with a report heard
// before, or never heard.
func TestPlanIsTheMapJoin(t *testing.T) {
	regions := []string{"ap", "eu", "us", "za"}
	r := rand.New(rand.NewPCG(5, 6))
	report := func(quotas bool) []entry { return randomReport(r, 2, quotas) }
	k := DefaultKnobs()
	for range 500 {
		m, err := NewMachine(MachineConfig{Region: "eu", Regions: regions, Limits: testLimits, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		rd := &round{reports: map[string]*assembly{}}
		heard := []string{"eu"}
		for _, name := range []string{"ap", "us", "za"} {
			switch r.IntN(3) {
			case 0:
				es := report(true)
				rd.reports[name] = &assembly{done: true, entries: es, keyed: es}
				heard = append(heard, name)
			case 1:
				m.inbox.last[name] = report(true)
			}
		}
		slices.Sort(heard)
		mine := report(false)

		got := m.planner.plan(rd, mine, heard, m.inbox.last, k)
		want := mapPlan(m, rd, mine, heard, k)
		if keys := slices.Sorted(maps.Keys(want)); !slices.Equal(got.keys, keys) {
			t.Fatalf("heard %v: planned keys %v, want %v", heard, got.keys, keys)
		}
		for i, key := range got.keys {
			if g, w := fmt.Sprint(got.plan(i)), fmt.Sprint(want[key]); g != w {
				t.Fatalf("heard %v, key %s: plan %s, want %s", heard, key, g, w)
			}
		}
	}
}

// randomReport is a report of about one in n of 60 keys, one in nine of
// no global limit, with random demand and shares and, with quotas, quota
// counts among them.
func randomReport(r *rand.Rand, n int, quotas bool) []entry {
	var es []entry
	for i := range 60 {
		if r.IntN(n) != 0 {
			continue
		}
		key := fmt.Sprintf("rl:{t=%d}:global:rps", i)
		if i%9 == 0 {
			key = fmt.Sprintf("rl:{t=%d}:local:rps", i) // not global
		}
		e := entry{key: key, rate: float32(r.IntN(400)), weight: float32(r.IntN(400))}
		if r.IntN(3) > 0 {
			e.share = rebalance.Share(r.Int64N(int64(rebalance.Unit) / 2))
		}
		if quotas && r.IntN(5) == 0 {
			// A quota count, under a rate key's name so that planning
			// it would show (quota counts name no key to plan).
			e = entry{key: key, window: 20_000, used: uint64(r.IntN(100))}
		}
		es = append(es, e)
	}
	return byKey(es)
}

// mapPlan is plan as a join through maps: every heard region's report
// indexed by key, the keys those reports name (quota counts aside), and
// the shares last heard from the others.
func mapPlan(m *Machine, r *round, mine []entry, heard []string, k Knobs) map[string]rebalance.KeyPlan {
	index := func(es []entry) map[string]entry {
		out := map[string]entry{}
		for _, e := range es {
			out[e.key] = e
		}
		return out
	}
	byRegion := map[string]map[string]entry{m.cfg.Region: index(mine)}
	keys := map[string]bool{}
	for _, e := range mine {
		keys[e.key] = true
	}
	for _, name := range heard {
		if a := r.reports[name]; a != nil && name != m.cfg.Region {
			byRegion[name] = index(a.entries)
			for _, e := range a.entries {
				if e.window == 0 {
					keys[e.key] = true
				}
			}
		}
	}
	def := rebalance.Default(len(m.cfg.Regions))
	params := rebalance.Params{Floor: k.Floor, Decay: k.Decay, Headroom: k.Headroom}
	plans := map[string]rebalance.KeyPlan{}
	for key := range keys {
		lim, ok := m.cfg.Limits.Global(key)
		if !ok {
			continue
		}
		var regions []rebalance.Region
		for _, name := range m.cfg.Regions {
			reg := rebalance.Region{Name: name, Share: def}
			if em, ok := byRegion[name]; ok {
				reg.Heard = true
				if e, ok := em[key]; ok {
					reg.Demand = rebalance.Demand{Rate: float64(e.rate), Weight: float64(e.weight)}
					if e.share != 0 {
						reg.Share = e.share
					}
				}
			} else if e, ok := index(m.inbox.last[name])[key]; ok && e.share != 0 {
				reg.Share = e.share
			}
			regions = append(regions, reg)
		}
		plans[key] = rebalance.Plan(m.cfg.Region, regions, lim.Rate, params)
	}
	return plans
}

// TestMidPlanIsTheMapJoin: midPlan's merge plans the keys any region's
// mid-interval report names, each from that region's mid entry, else its
// epoch entry, else nothing, and this region's share in force, as a join
// through maps does: random mid and epoch reports with quota counts and
// keys of no global limit.
func TestMidPlanIsTheMapJoin(t *testing.T) {
	regions := []string{"ap", "eu", "us", "za"}
	r := rand.New(rand.NewPCG(7, 8))
	report := func(n int, quotas bool) []entry { return randomReport(r, n, quotas) }
	index := func(es []entry) map[string]entry {
		out := map[string]entry{}
		for _, e := range es {
			if e.window == 0 {
				out[e.key] = e
			}
		}
		return out
	}
	k := DefaultKnobs()
	def := rebalance.Default(len(regions))
	params := rebalance.Params{Floor: k.Floor, Decay: k.Decay, Headroom: k.Headroom}
	for range 500 {
		m, err := NewMachine(MachineConfig{Region: "eu", Regions: regions, Limits: testLimits, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		e := &epoch{k: k, r: &round{reports: map[string]*assembly{}}, mine: report(4, false)}
		m.reports.base.mine = report(2, false)
		fresh := map[string]map[string]entry{"eu": index(e.mine)}
		base := map[string]map[string]entry{"eu": index(m.reports.base.mine)}
		for _, name := range []string{"ap", "us", "za"} {
			es := report(2+r.IntN(6), true)
			e.r.reports[name] = &assembly{done: true, entries: es, keyed: es}
			m.inbox.last[name] = report(2, true)
			fresh[name], base[name] = index(es), index(m.inbox.last[name])
		}
		for key := range base["eu"] {
			if r.IntN(2) == 0 {
				m.ledger.own[key] = rebalance.Share(r.Int64N(int64(rebalance.Unit) / 2))
			}
		}

		want := map[string]rebalance.KeyPlan{}
		for _, f := range fresh {
			for key := range f {
				lim, ok := m.cfg.Limits.Global(key)
				if !ok {
					continue
				}
				var rs []rebalance.Region
				for _, name := range regions {
					reg := rebalance.Region{Name: name, Heard: true, Share: def}
					en, ok := fresh[name][key]
					if !ok {
						en, ok = base[name][key]
					}
					if ok {
						reg.Demand = rebalance.Demand{Rate: float64(en.rate), Weight: float64(en.weight)}
						if en.share != 0 {
							reg.Share = en.share
						}
					}
					if name == "eu" {
						reg.Share = def
						if s, ok := m.ledger.own[key]; ok {
							reg.Share = s
						}
					}
					rs = append(rs, reg)
				}
				want[key] = rebalance.Plan("eu", rs, lim.Rate, params)
			}
		}
		got := m.planner.midPlan(e, m.reports.base.mine, m.inbox.last, m.ledger.own)
		if keys := slices.Sorted(maps.Keys(want)); !slices.Equal(got.keys, keys) {
			t.Fatalf("planned keys %v, want %v", got.keys, keys)
		}
		for i, key := range got.keys {
			if g, w := fmt.Sprint(got.plan(i)), fmt.Sprint(want[key]); g != w {
				t.Fatalf("key %s: plan %s, want %s", key, g, w)
			}
		}
	}
}
