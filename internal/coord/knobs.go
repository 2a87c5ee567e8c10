package coord

import (
	"errors"
	"fmt"
	"time"

	"github.com/allot-dev/allot/policy"
)

// Knobs are the coordinator's runtime settings. They are held behind an
// atomic pointer and may be replaced while the coordinator runs
// (Coordinator.SetKnobs); a change takes effect at the next epoch. The
// settings document of the policy store is meant to feed SetKnobs.
//
// Floor, Smoothing and Decay are inputs of the share computation and must
// be equal in every region for the regions to agree; a region whose knobs
// differ still never oversubscribes (growth needs the other regions' acks
// of plans computed from identical heard sets, not identical knobs), but
// it may under-use the limit until the knobs agree again.
type Knobs struct {
	// Interval is the rebalance epoch. Regions number epochs by
	// floor(unix time / Interval), so every region must use the same one.
	// From 2·demandWindow (6 s) on, each epoch has a mid-interval round.
	Interval time.Duration
	// Gather is the fraction of Interval each of the two phases waits for
	// the other regions' messages before going on without them.
	Gather float64
	// HeavyHitter is the fraction of a key's fair rate (L/n) above which
	// its demand travels in reports; other keys keep the default share.
	HeavyHitter float64
	// QuotaThreshold is the fraction of a global quota's fair part (L/n)
	// a region must have counted in the window before the count travels;
	// smaller counts are known only in their region (the overshoot bound
	// of docs/multi-region.md, "Global quotas", includes them).
	QuotaThreshold float64
	// Floor is the share every region keeps, as a fraction of L/n.
	Floor float64
	// Headroom is the margin over its measured demand a region is given
	// before spare capacity is split (0.1: demand 20/s gets 22/s).
	// Headroom of a key's fair rate L/n is also how far its demand must
	// move to travel in a mid-interval round.
	Headroom float64
	// Smoothing is the weight of the newest interval in the smoothed
	// demand that splits spare capacity (1 = no smoothing).
	Smoothing float64
	// Decay is the fraction of its excess over L/n that a region hearing
	// no other region gives up per epoch (the partition decay).
	Decay float64
	// ShareTTL is how long a written share outlives its last rewrite in
	// Redis; it must comfortably exceed a standby's takeover time.
	ShareTTL time.Duration
}

// DefaultKnobs are the defaults: a 10 s interval, 25% of it per phase,
// heavy hitters above 10% of their fair rate, quota counts travelling
// from 1% of their fair part, a floor of 10% of the fair
// share (so a region whose key does not travel keeps what it may be
// using), 5% headroom over measured demand (every served region's
// headroom is taken from the throttled ones: at 10% two quiet regions of
// three left 5% of L unused; docs/simulation.md, "Accuracy"), smoothing
// 0.5, decay 0.25 per epoch, shares kept 1 h.
func DefaultKnobs() Knobs {
	return Knobs{
		Interval:    10 * time.Second,
		Gather:      0.25,
		HeavyHitter: 0.1,
		// 1% of L/n: n-1 regions' untravelled counts stay under 1% of L.
		QuotaThreshold: 0.01,
		Floor:          0.1,
		Headroom:       0.05,
		Smoothing:      0.5,
		Decay:          0.25,
		ShareTTL:       time.Hour,
	}
}

// Validate reports every knob out of range.
func (k Knobs) Validate() error {
	var errs []error
	if k.Interval < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("interval %v: want at least 10ms", k.Interval))
	}
	if !(k.Gather > 0 && k.Gather <= 0.45) {
		errs = append(errs, fmt.Errorf("gather %v: want (0, 0.45] (two phases must fit in one interval)", k.Gather))
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"heavy-hitter", k.HeavyHitter}, {"quota-threshold", k.QuotaThreshold}, {"floor", k.Floor}, {"smoothing", k.Smoothing}, {"decay", k.Decay}} {
		if !(f.v >= 0 && f.v <= 1) {
			errs = append(errs, fmt.Errorf("%s %v: want [0, 1]", f.name, f.v))
		}
	}
	if !(k.Headroom >= 0 && k.Headroom <= 10) {
		errs = append(errs, fmt.Errorf("headroom %v: want [0, 10]", k.Headroom))
	}
	if k.Smoothing == 0 {
		errs = append(errs, errors.New("smoothing 0 would freeze the demand weights: want (0, 1]"))
	}
	if k.ShareTTL < 2*k.Interval {
		errs = append(errs, fmt.Errorf("share TTL %v: want at least two intervals (%v)", k.ShareTTL, 2*k.Interval))
	}
	return errors.Join(errs...)
}

// With returns k overridden by the knobs a settings document's
// `rebalance:` block sets; absent ones keep k's (allot-coordinator's k
// is DefaultKnobs, so removing a knob from the document restores its
// default). A nil block returns k.
func (k Knobs) With(r *policy.RebalanceKnobs) Knobs {
	if r == nil {
		return k
	}
	if r.Interval != 0 {
		k.Interval = time.Duration(r.Interval)
	}
	if r.ShareTTL != 0 {
		k.ShareTTL = time.Duration(r.ShareTTL)
	}
	for _, f := range [...]struct {
		dst *float64
		src *float64
	}{{&k.Gather, r.Gather}, {&k.HeavyHitter, r.HeavyHitter}, {&k.QuotaThreshold, r.QuotaThreshold}, {&k.Floor, r.Floor}, {&k.Headroom, r.Headroom}, {&k.Smoothing, r.Smoothing}, {&k.Decay, r.Decay}} {
		if f.src != nil {
			*f.dst = *f.src
		}
	}
	return k
}
