// Package rebalance computes each region's share of a global limit from
// the regions' demand reports. It is pure: no I/O, no clock, no goroutine,
// no dependence on map order or on the order of its inputs, so that every
// region computes the same shares from the same reports and no consensus
// is needed. Its max-min fair split (Fair) also splits a region bucket
// among its RLQS consumers (internal/rlqs).
//
// rebalance owns the share arithmetic and nothing of its transport: the
// reports, the acks, the writes and their order are the coordinator's
// (internal/coord). It must never hand out more than the pool it is given.
//
// # Shares
//
// A share is an integer number of parts per billion (Unit) of the global
// limit L: a region with share s enforces rate s/Unit·L.rate and burst
// s/Unit·L.burst. Integer shares make "the shares sum to at most L" exact
// arithmetic rather than a floating-point hope.
//
// # The fair target (Fair)
//
// With n regions, a pool P to split among m of them, a floor F per region
// and each region's demand d_r (tokens/s, admitted + denied, in share
// units) and smoothed demand w_r:
//
//	need_r = max(F, d_r)
//	if Σ need_r >= P:  x_r = max(F, min(d_r, level)),  level such that Σ x_r = P
//	                   (max-min fair: every region under the level is served in full)
//	else:              x_r = need_r + (P − Σ need) · w_r / Σ w
//	                   (everyone served; the spare follows the smoothed demand)
//
// x_r is nondecreasing in region r's own demand, is at least F, and sums
// to P (to at most P after rounding down to integers).
//
// # The epoch protocol (Plan, Grow)
//
// Shares change in two phases per epoch so that growth never lands before
// the shrinks that pay for it; see docs/multi-region.md for the proof that
// the enforced shares never sum to more than Unit, under any partition.
package rebalance

import (
	"cmp"
	"math"
	"slices"
)

// Unit is the share of the whole global limit.
const Unit Share = 1_000_000_000

// Share is a part of a global limit in parts per billion (see Unit).
type Share uint32

// Of returns the share's part of v (a rate or a burst).
func (s Share) Of(v float64) float64 { return v * float64(s) / float64(Unit) }

// Default is every region's share before any rebalance: Unit/n rounded
// down, so n defaults never sum to more than Unit.
func Default(n int) Share {
	if n <= 0 {
		return 0
	}
	return Unit / Share(n)
}

// Demand is one region's demand for one key.
type Demand struct {
	// Rate is admitted + denied tokens per second over the last interval.
	Rate float64
	// Weight is the smoothed demand (see Smooth); it splits spare capacity
	// so that headroom follows the traffic without chasing its noise.
	Weight float64
}

// Smooth returns the next smoothed demand: an exponentially weighted
// moving average with weight alpha on the new rate. alpha is clamped to
// [0, 1]; alpha = 1 is no smoothing. A region smooths its own demand and
// reports the result, so all regions use the same weights.
func Smooth(prev, rate, alpha float64) float64 {
	alpha = clamp01(alpha)
	if !(prev >= 0) || math.IsInf(prev, 0) {
		prev = 0
	}
	return prev + alpha*(sanitize(rate)-prev)
}

// FloorShare is the floor of each of n regions for a floor fraction of
// the fair share Unit/n.
func FloorShare(n int, fraction float64) Share {
	if n <= 0 {
		return 0
	}
	return Share(math.Floor(clamp01(fraction) * float64(Unit) / float64(n)))
}

// Fair splits pool among regions by the fair target (see the package
// comment). limit is the global rate in tokens/s (demand is measured in
// tokens/s; dividing by limit turns it into share units); floor is each
// region's floor. The result is in the order of demands, rounded down, and
// sums to at most pool. It depends only on its arguments' values: callers
// that want order independence pass demands in a canonical order (Plan
// sorts by region name).
func Fair(pool Share, limit float64, floor Share, demands []Demand) []Share {
	m := len(demands)
	out := make([]Share, m)
	if m == 0 || pool == 0 {
		return out
	}
	P, F := float64(pool), float64(floor)
	if P <= float64(m)*F {
		// Not even the floors fit (a partition left little to split).
		return quantize(P, equal(m, P/float64(m)), pool)
	}
	d := make([]float64, m)
	needSum := 0.0
	for i, dm := range demands {
		if limit > 0 {
			d[i] = sanitize(dm.Rate) / limit * float64(Unit)
		}
		needSum += math.Max(F, d[i])
	}
	if needSum >= P {
		return quantize(P, waterFill(P, F, d), pool)
	}
	spare := P - needSum
	x := make([]float64, m)
	wSum := 0.0
	for _, dm := range demands {
		wSum += sanitize(dm.Weight)
	}
	for i, dm := range demands {
		x[i] = math.Max(F, d[i])
		if wSum > 0 {
			x[i] += spare * sanitize(dm.Weight) / wSum
		} else {
			x[i] += spare / float64(m)
		}
	}
	return quantize(P, x, pool)
}

// waterFill returns x_r = max(F, min(d_r, level)) with Σ x_r = P, for
// P > m·F and Σ max(F, d_r) >= P. Regions are filled in ascending demand;
// a region whose demand is under the running average of what is left is
// served in full, and the rest share what remains equally (the level).
func waterFill(P, F float64, d []float64) []float64 {
	m := len(d)
	x := make([]float64, m)
	idx := make([]int, 0, m)
	left := P
	for i, v := range d {
		if v <= F {
			x[i] = F
			left -= F
			continue
		}
		idx = append(idx, i)
	}
	// Stable on equal demands: the level is the same for them anyway.
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(d[a], d[b]) })
	for k, i := range idx {
		rest := len(idx) - k
		if d[i]*float64(rest) <= left {
			x[i] = d[i]
			left -= d[i]
			continue
		}
		level := left / float64(rest)
		for _, j := range idx[k:] {
			x[j] = level
		}
		break
	}
	return x
}

// quantize rounds x down to integer shares and, should floating-point
// error leave the integers above pool, takes the excess from the largest
// (the first of equals), so the result never sums to more than pool.
func quantize(P float64, x []float64, pool Share) []Share {
	out := make([]Share, len(x))
	var sum int64
	for i, v := range x {
		v = math.Floor(math.Min(math.Max(v, 0), P))
		out[i] = Share(v)
		sum += int64(out[i])
	}
	for sum > int64(pool) {
		big := 0
		for i := range out {
			if out[i] > out[big] {
				big = i
			}
		}
		cut := min(sum-int64(pool), int64(out[big]))
		out[big] -= Share(cut)
		sum -= cut
	}
	return out
}

func equal(m int, v float64) []float64 {
	x := make([]float64, m)
	for i := range x {
		x[i] = v
	}
	return x
}

// sanitize maps NaN, negative and infinite demand to 0: a corrupt report
// must not take capacity from anyone.
func sanitize(v float64) float64 {
	if !(v > 0) || math.IsInf(v, 1) {
		return 0
	}
	return v
}

func clamp01(v float64) float64 {
	if !(v > 0) {
		return 0
	}
	return math.Min(v, 1)
}
