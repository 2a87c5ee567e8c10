package policy

import "time"

// RebalanceKnobs tune the multi-region coordinators at runtime (see
// docs/multi-region.md, "Knobs"). They live in the settings document so
// that operators change them without restarting coordinators, and it is
// their only source: an absent knob (nil, or a zero duration) keeps its
// default (coord.DefaultKnobs). The fractions are pointers because 0 is a meaningful value for
// most of them (floor 0, decay 0), distinct from "not set".
type RebalanceKnobs struct {
	// Interval is the rebalance epoch; every region must use the same one.
	Interval Duration `yaml:"interval" json:"interval,omitempty"`
	// Gather is the fraction of Interval each phase waits for the others.
	Gather *float64 `yaml:"gather" json:"gather,omitempty"`
	// HeavyHitter: demand above this fraction of a key's fair rate travels.
	HeavyHitter *float64 `yaml:"heavy_hitter" json:"heavy_hitter,omitempty"`
	// QuotaThreshold: a global quota's count travels once it reaches this
	// fraction of the quota's fair part (L/n) in its window.
	QuotaThreshold *float64 `yaml:"quota_threshold" json:"quota_threshold,omitempty"`
	// Floor is the share every region keeps, as a fraction of L/n.
	Floor *float64 `yaml:"floor" json:"floor,omitempty"`
	// Headroom is the margin over measured demand given before spare is split.
	Headroom *float64 `yaml:"headroom" json:"headroom,omitempty"`
	// Smoothing is the weight of the newest interval in the smoothed demand.
	Smoothing *float64 `yaml:"smoothing" json:"smoothing,omitempty"`
	// Decay is the fraction of its excess over L/n an isolated region
	// gives up per interval (the partition decay).
	Decay *float64 `yaml:"decay" json:"decay,omitempty"`
	// ShareTTL is how long a written share outlives its last rewrite.
	ShareTTL Duration `yaml:"share_ttl" json:"share_ttl,omitempty"`
}

// Bounds on rebalance knobs; they match coord.Knobs.Validate, which
// checks the knobs again once the defaults fill the gaps.
const (
	MinRebalanceInterval = 10 * time.Millisecond
	MaxGather            = 0.45
	MaxHeadroom          = 10
)

// LeaseDefaults returns the set-wide lease knobs (the file's `lease:`
// block): a leased policy's zero knobs take these, and zero knobs here
// take the lease package's defaults.
func (s *Set) LeaseDefaults() LeaseKnobs { return s.lease }

// settings validates the file-level runtime blocks and how the set-wide
// lease defaults combine with each leased policy's own knobs.
func (v *validator) settings(f *File) {
	if r := f.Rebalance; r != nil {
		v.rebalance(r)
	}
	if k := f.Lease; k != nil {
		v.leaseKnobs("", k)
		// A policy's ttl and the set's target_period (or the reverse) must
		// still agree once combined, or the policy's grants would expire
		// before use and the node would quietly take the exact path.
		for i := range f.Policies {
			p := &f.Policies[i]
			if p.Precision != PrecisionLeased || p.Lease == nil {
				continue
			}
			tp, ttl := p.Lease.TargetPeriod, p.Lease.TTL
			if tp == 0 {
				tp = k.TargetPeriod
			}
			if ttl == 0 {
				ttl = k.TTL
			}
			if (p.Lease.TargetPeriod == 0) != (p.Lease.TTL == 0) && tp != 0 && ttl != 0 && ttl < tp {
				v.add(p.ID, "lease.ttl", "%v is shorter than lease.target_period %v once combined with the file's lease block", time.Duration(ttl), time.Duration(tp))
			}
		}
	}
}

func (v *validator) rebalance(r *RebalanceKnobs) {
	iv, ttl := time.Duration(r.Interval), time.Duration(r.ShareTTL)
	if iv != 0 && iv < MinRebalanceInterval {
		v.add("", "rebalance.interval", "%v: want at least %v (0 keeps the default)", iv, MinRebalanceInterval)
	}
	if g := r.Gather; g != nil && !(*g > 0 && *g <= MaxGather) {
		v.add("", "rebalance.gather", "%v out of range (0, %v] (two phases must fit in one interval)", *g, MaxGather)
	}
	for _, f := range [...]struct {
		field string
		val   *float64
	}{{"rebalance.heavy_hitter", r.HeavyHitter}, {"rebalance.quota_threshold", r.QuotaThreshold}, {"rebalance.floor", r.Floor}, {"rebalance.decay", r.Decay}} {
		if f.val != nil && !(*f.val >= 0 && *f.val <= 1) {
			v.add("", f.field, "%v out of range [0, 1]", *f.val)
		}
	}
	if s := r.Smoothing; s != nil && !(*s > 0 && *s <= 1) {
		v.add("", "rebalance.smoothing", "%v out of range (0, 1] (0 would freeze the demand weights)", *s)
	}
	if h := r.Headroom; h != nil && !(*h >= 0 && *h <= MaxHeadroom) {
		v.add("", "rebalance.headroom", "%v out of range [0, %v]", *h, MaxHeadroom)
	}
	switch {
	case ttl == 0:
	case ttl < 2*MinRebalanceInterval:
		v.add("", "rebalance.share_ttl", "%v: want at least two intervals (0 keeps the default)", ttl)
	case iv >= MinRebalanceInterval && ttl < 2*iv:
		v.add("", "rebalance.share_ttl", "%v: want at least two intervals (%v)", ttl, 2*iv)
	}
}
