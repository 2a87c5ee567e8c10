package policy

import "time"

// LeaseKnobs tune the leases of a `precision: leased` policy (see package
// lease and ARCHITECTURE.md ("Leasing") for what each trades). In a
// policy, a zero knob takes the file's `lease:` block (File.Lease, the
// set-wide defaults); there, a zero knob takes the lease package's
// defaults (lease.Defaults).
type LeaseKnobs struct {
	// TargetPeriod: a grant is the key's recent rate on a node times this.
	TargetPeriod Duration `yaml:"target_period" json:"target_period,omitempty"`
	// TTL: how long leased tokens may be spent; the overshoot bound grows
	// by rate x TTL.
	TTL Duration `yaml:"ttl" json:"ttl,omitempty"`
	// LowWatermark: refill when this fraction of the last grant is left.
	LowWatermark float64 `yaml:"low_watermark" json:"low_watermark,omitempty"`
	// MaxShare: one grant is at most this fraction of the burst.
	MaxShare float64 `yaml:"max_share" json:"max_share,omitempty"`
	// ColdHits: a key is decided exactly (one Redis check each) until it
	// shows this many checks within half the TTL, and leases from then
	// on (higher: fewer leases for keys at a few checks a second); 1 to
	// MaxLeaseColdHits.
	ColdHits int `yaml:"cold_hits" json:"cold_hits,omitempty"`
}

// Bounds on lease knobs.
const (
	MinLeasePeriod = 10 * time.Millisecond
	MaxLeasePeriod = time.Hour
	// MaxLeaseColdHits is lease.MaxColdHits: a key's count is 8 bits.
	MaxLeaseColdHits = 255
)

func (v *validator) lease(id string, p *Policy) {
	k := p.Lease
	if k == nil {
		return
	}
	if p.Precision != PrecisionLeased {
		v.add(id, "lease", "only a policy with precision: leased takes lease knobs")
	}
	v.leaseKnobs(id, k)
}

// leaseKnobs checks one lease block, a policy's (id) or the file's (""),
// against the ranges of lease.Config.Validate.
func (v *validator) leaseKnobs(id string, k *LeaseKnobs) {
	for _, d := range [...]struct {
		field string
		val   time.Duration
	}{{"lease.target_period", time.Duration(k.TargetPeriod)}, {"lease.ttl", time.Duration(k.TTL)}} {
		if d.val != 0 && (d.val < MinLeasePeriod || d.val > MaxLeasePeriod) {
			v.add(id, d.field, "%v out of range [%v, %v] (0 means the node's default)", d.val, MinLeasePeriod, MaxLeasePeriod)
		}
	}
	if k.TargetPeriod != 0 && k.TTL != 0 && k.TTL < k.TargetPeriod {
		v.add(id, "lease.ttl", "%v is shorter than lease.target_period %v: grants would expire before use", time.Duration(k.TTL), time.Duration(k.TargetPeriod))
	}
	if !(k.LowWatermark >= 0 && k.LowWatermark < 1) {
		v.add(id, "lease.low_watermark", "%v out of range [0, 1)", k.LowWatermark)
	}
	if !(k.MaxShare >= 0 && k.MaxShare <= 1) {
		v.add(id, "lease.max_share", "%v out of range (0, 1] (0 means the node's default)", k.MaxShare)
	}
	if k.ColdHits < 0 || k.ColdHits > MaxLeaseColdHits {
		v.add(id, "lease.cold_hits", "%d out of range [1, %d] (0 means the node's default)", k.ColdHits, MaxLeaseColdHits)
	}
}
