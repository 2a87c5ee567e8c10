package loadgen

import (
	"fmt"
	"math"
	"time"
)

// router picks a region index (regionsOf) for a request due at offset
// at, from a uniform u in [0, 1). Immutable once built.
type router struct {
	before, after []float64 // cumulative shares per target; after is nil without a shift
	shiftAt       time.Duration
}

func newRouter(targets []Target, split []Weight, shiftAt time.Duration, shift []Weight) (*router, error) {
	regions := regionsOf(targets)
	b, err := cumulative(regions, split)
	if err != nil {
		return nil, fmt.Errorf("split: %w", err)
	}
	r := &router{before: b, shiftAt: shiftAt}
	if shiftAt > 0 {
		if r.after, err = cumulative(regions, shift); err != nil {
			return nil, fmt.Errorf("shift split: %w", err)
		}
	}
	return r, nil
}

// cumulative turns region shares into cumulative fractions in region
// order. No shares means an even split; a region a split leaves out gets
// no traffic.
func cumulative(regions []string, split []Weight) ([]float64, error) {
	share := make([]float64, len(regions))
	if len(split) == 0 {
		for i := range share {
			share[i] = 1
		}
	}
	index := map[string]int{}
	for i, r := range regions {
		index[r] = i
	}
	seen := map[string]bool{}
	for _, w := range split {
		i, ok := index[w.Region]
		if !ok {
			return nil, fmt.Errorf("region %q has no target", w.Region)
		}
		if seen[w.Region] {
			return nil, fmt.Errorf("region %q given twice", w.Region)
		}
		seen[w.Region] = true
		if w.Share < 0 || math.IsNaN(w.Share) || math.IsInf(w.Share, 0) {
			return nil, fmt.Errorf("region %q: share %v, want a finite number >= 0", w.Region, w.Share)
		}
		share[i] = w.Share
	}
	sum := 0.0
	for _, s := range share {
		sum += s
	}
	if sum <= 0 {
		return nil, fmt.Errorf("shares sum to %v, want > 0", sum)
	}
	acc := 0.0
	for i, s := range share {
		acc += s / sum
		share[i] = acc
	}
	// Rounding must not leave a gap above the last region with traffic.
	for i := len(share) - 1; i >= 0 && share[i] >= 1-1e-9; i-- {
		share[i] = 1
	}
	return share, nil
}

// pick returns the region for a request due at offset at.
func (r *router) pick(at time.Duration, u float64) int {
	cum := r.before
	if r.after != nil && at >= r.shiftAt {
		cum = r.after
	}
	for i, c := range cum {
		if u < c {
			return i
		}
	}
	return len(cum) - 1 // unreachable: the last share is 1 and u < 1
}
