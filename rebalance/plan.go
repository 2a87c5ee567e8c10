package rebalance

import (
	"math"
	"slices"
	"strings"
)

// Params are the algorithm's knobs. They must be equal in every region
// (they are part of the inputs every region computes the same answer from).
type Params struct {
	// Floor is the share every region keeps, as a fraction of the fair
	// share Unit/n, in [0, 1]: a region whose traffic is still to be seen
	// can serve that much at once.
	Floor float64
	// Decay is, for a region that hears no other region, the fraction of
	// its excess over the fair share it gives up each epoch, in [0, 1].
	Decay float64
	// Headroom inflates every demand by this fraction (>= 0) before
	// sharing, so a region whose demand is met keeps a margin for the
	// noise of one interval's measurement and for tokens its nodes'
	// leases strand; the throttled regions pay for it.
	Headroom float64
}

// Region is what one region knows of another (or of itself) for one key
// in one epoch.
type Region struct {
	Name string
	// Heard says this region's complete report of the epoch arrived.
	Heard bool
	// Demand is its reported demand; ignored when not Heard.
	Demand Demand
	// Share is its share during the previous epoch: the reported one when
	// Heard, else the last one heard from it (Default when none was).
	Share Share
}

// KeyPlan is the first phase of an epoch for one key, as one region (Self)
// sees it. Slices are indexed like Regions, which is sorted by name.
type KeyPlan struct {
	Self    int
	Regions []string
	Heard   []bool
	// Prev is each region's share during the previous epoch.
	Prev []Share
	// Target is the fair target over the heard regions (0 for the others).
	Target []Share
	// Shrunk is each heard region's first-phase share, min(Prev, Target)
	// (the isolated self also decays toward the fair share); unheard
	// regions keep Prev.
	Shrunk []Share
}

// Plan computes the first phase for self. Its inputs may come in any
// order; duplicate names keep the first occurrence.
//
// Rules (docs/multi-region.md proves they keep Σ shares <= Unit):
//   - with every region heard, the target is Fair over all of them with
//     the pool Unit;
//   - with some region unheard, the heard regions only redistribute what
//     they hold themselves: the pool is Σ Prev over the heard regions, and
//     every unheard region is assumed to still hold its last share (never
//     hand out what it may be using). The pool comes from the heard
//     reports only, so every region with the same heard set computes the
//     same plan;
//   - in the first phase every region only shrinks: min(Prev, Target);
//   - a region that hears no other region shrinks toward Unit/n by Decay
//     of its excess each epoch, and never grows.
func Plan(self string, regions []Region, limit float64, p Params) KeyPlan {
	var kp KeyPlan
	PlanInto(&kp, self, regions, limit, p)
	return kp
}

// PlanInto is Plan written into kp (zero, or a plan of PlanInto's), whose
// slices it reuses when they have room: a caller that plans many keys in
// turn (a coordinator plans every global key each epoch, up to millions)
// allocates them once.
func PlanInto(kp *KeyPlan, self string, regions []Region, limit float64, p Params) {
	rs := canonical(regions)
	n := len(rs)
	kp.Self = -1
	kp.Regions, kp.Heard = resize(kp.Regions, n), resize(kp.Heard, n)
	if cap(kp.Prev) < n || cap(kp.Target) < n || cap(kp.Shrunk) < n {
		shares := make([]Share, 3*n) // one allocation, not three
		kp.Prev, kp.Target, kp.Shrunk = shares[:n:n], shares[n:2*n:2*n], shares[2*n:]
	}
	kp.Prev, kp.Target, kp.Shrunk = kp.Prev[:n], kp.Target[:n], kp.Shrunk[:n]
	clear(kp.Target) // an unheard region's stays 0
	var pool int64
	var heard []int
	var demands []Demand
	for i, r := range rs {
		kp.Regions[i], kp.Heard[i], kp.Prev[i] = r.Name, r.Heard, min(r.Share, Unit)
		if r.Name == self {
			kp.Self = i
		}
		if r.Heard {
			heard = append(heard, i)
			d := r.Demand
			if p.Headroom > 0 {
				d.Rate *= 1 + p.Headroom
			}
			demands = append(demands, d)
			pool += int64(kp.Prev[i])
		}
	}
	if len(heard) == n || pool > int64(Unit) {
		pool = int64(Unit) // corrupt reports must not make a pool above L
	}
	copy(kp.Shrunk, kp.Prev)
	if kp.Self < 0 || !kp.Heard[kp.Self] {
		return // self must always be in its own view; be inert if not
	}
	floor := FloorShare(n, p.Floor)
	for j, s := range Fair(Share(pool), limit, floor, demands) {
		i := heard[j]
		kp.Target[i] = s
		kp.Shrunk[i] = min(kp.Prev[i], s)
	}
	if len(heard) == 1 && n > 1 {
		kp.Shrunk[kp.Self] = decay(kp.Prev[kp.Self], Default(n), p.Decay)
	}
}

// resize returns s with length n, reusing its array when it has room.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// decay moves prev toward fair by fraction d of its excess, rounding the
// cut up so a positive Decay always makes progress; never below fair,
// never up.
func decay(prev, fair Share, d float64) Share {
	if prev <= fair {
		return prev
	}
	cut := Share(math.Ceil(clamp01(d) * float64(prev-fair)))
	return prev - cut
}

// Full reports whether every region was heard.
func (kp KeyPlan) Full() bool {
	return !slices.Contains(kp.Heard, false)
}

// Grow is the second phase: self's final share of the epoch. group says
// that every heard region acknowledged, with an identical heard set and
// ok, that it applied its first-phase shares; only then may anyone grow,
// and only into capacity that is provably free:
//   - the group's own releases, Σ over heard (Prev − Shrunk), and
//   - when every region was heard, what no region holds: Unit − Σ Prev.
//
// That capacity goes to the heard regions still under their target, in
// proportion to what each lacks, rounded down. An isolated region never
// grows.
func (kp KeyPlan) Grow(group bool) Share {
	if kp.Self < 0 {
		return 0
	}
	own := kp.Shrunk[kp.Self]
	heard := 0
	for _, h := range kp.Heard {
		if h {
			heard++
		}
	}
	if !group || heard < 2 || !kp.Heard[kp.Self] {
		return own
	}
	var free, prevSum, wantSum int64
	for i, h := range kp.Heard {
		prevSum += int64(kp.Prev[i])
		if h {
			free += int64(kp.Prev[i]) - int64(kp.Shrunk[i])
			wantSum += max(0, int64(kp.Target[i])-int64(kp.Shrunk[i]))
		}
	}
	if kp.Full() {
		free += max(0, int64(Unit)-prevSum)
	}
	want := max(0, int64(kp.Target[kp.Self])-int64(own))
	if want == 0 || free <= 0 {
		return own
	}
	if wantSum <= free {
		return own + Share(want)
	}
	// want·free < 2^30·2^30: no overflow in int64.
	return own + Share(want*free/wantSum)
}

// canonical sorts a copy of regions by name and drops duplicate names
// (keeping the first), so the order of the inputs never matters. Regions
// already in that order (a caller's usual input) are returned as they are:
// Plan only reads them.
func canonical(regions []Region) []Region {
	sorted := true
	for i := 1; i < len(regions) && sorted; i++ {
		sorted = regions[i-1].Name < regions[i].Name
	}
	if sorted {
		return regions
	}
	rs := make([]Region, 0, len(regions))
	seen := make(map[string]bool, len(regions))
	for _, r := range regions {
		if !seen[r.Name] {
			seen[r.Name] = true
			rs = append(rs, r)
		}
	}
	slices.SortStableFunc(rs, func(a, b Region) int { return strings.Compare(a.Name, b.Name) })
	return rs
}
