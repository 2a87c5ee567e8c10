package lease

import (
	"fmt"
	"math"
	"time"
)

// Config holds the knobs an operator tunes per policy (policy file
// `lease:` block) or per node (command-line defaults). A zero field means
// "use the default".
type Config struct {
	// TargetPeriod sizes grants: a grant is the key's recent rate on this
	// node times TargetPeriod. Longer means fewer Redis calls per decision
	// and more tokens parked on one node (less fair, more stranded on a
	// crash); shorter means more calls.
	TargetPeriod time.Duration
	// TTL is how long a grant's tokens may be spent, counted from before
	// the lease call is sent. It is the L of the overshoot bound
	// burst + rate*(T + TTL + tick): longer adds rate*TTL of overshoot,
	// shorter drops (strands) unspent tokens sooner. It must be at least
	// TargetPeriod, or grants expire before they are used.
	TTL time.Duration
	// LowWatermark starts an asynchronous refill when the tokens on hand
	// fall to LowWatermark times the last grant. Higher hides more Redis
	// latency (no request waits for a refill) at the cost of holding more
	// tokens; 0 refills only when empty, so requests wait.
	LowWatermark float64
	// MaxShare caps one grant at MaxShare times the bucket's burst, so
	// one node cannot hoard a bucket others need. Lower is fairer between
	// nodes and costs more calls on hot keys.
	MaxShare float64
	// ColdHits is how many Takes within one window of half the TTL make a
	// cold key warm, when the manager sends cold keys to the exact path
	// (Options.ColdExact): at the default TTL of 2 s and DefaultColdHits,
	// a key leases once it shows about 16 checks a second
	// (docs/performance.md, "Cold hits").
	// Higher: fewer leases for keys at a few checks a second. 1 to
	// MaxColdHits.
	ColdHits int
}

// Default knob values.
const (
	DefaultTargetPeriod = time.Second
	DefaultTTL          = 2 * time.Second
	DefaultLowWatermark = 0.25
	DefaultMaxShare     = 0.5
)

// Bounds on the knobs; outside them a value is a typo.
const (
	MinTargetPeriod = 10 * time.Millisecond
	MaxTTL          = time.Hour
)

// maxGrant keeps token counts of two merged lease generations inside an
// int32 (see entry.gens).
const maxGrant = 1 << 29

// Defaults returns the default knobs.
func Defaults() Config {
	return Config{TargetPeriod: DefaultTargetPeriod, TTL: DefaultTTL, LowWatermark: DefaultLowWatermark, MaxShare: DefaultMaxShare, ColdHits: DefaultColdHits}
}

// Or returns c with every zero field taken from d.
func (c Config) Or(d Config) Config {
	if c.TargetPeriod == 0 {
		c.TargetPeriod = d.TargetPeriod
	}
	if c.TTL == 0 {
		c.TTL = d.TTL
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = d.LowWatermark
	}
	if c.MaxShare == 0 {
		c.MaxShare = d.MaxShare
	}
	if c.ColdHits == 0 {
		c.ColdHits = d.ColdHits
	}
	return c
}

// Validate checks a complete Config (after Or).
func (c Config) Validate() error {
	switch {
	case c.TargetPeriod < MinTargetPeriod || c.TargetPeriod > MaxTTL:
		return fmt.Errorf("lease target period %v out of range [%v, %v]", c.TargetPeriod, MinTargetPeriod, MaxTTL)
	case c.TTL < c.TargetPeriod || c.TTL > MaxTTL:
		return fmt.Errorf("lease ttl %v out of range [target period %v, %v]", c.TTL, c.TargetPeriod, MaxTTL)
	case !(c.LowWatermark >= 0 && c.LowWatermark < 1):
		return fmt.Errorf("lease low watermark %v out of range [0, 1)", c.LowWatermark)
	case !(c.MaxShare > 0 && c.MaxShare <= 1):
		return fmt.Errorf("lease max share %v out of range (0, 1]", c.MaxShare)
	case c.ColdHits < 1 || c.ColdHits > MaxColdHits:
		return fmt.Errorf("lease cold hits %d out of range [1, %d]", c.ColdHits, MaxColdHits)
	}
	return nil
}

// GrantSize is how many tokens to ask for: rate (tokens/s, this node's
// recent use of the key) times TargetPeriod, capped at MaxShare of
// capacity, and never less than need (the cost a request is waiting for)
// or 1:
//
//	want = clamp(ceil(rate * TargetPeriod), max(need, 1), max(need, floor(MaxShare * capacity)))
func GrantSize(rate float64, c Config, capacity, need int64) int64 {
	want := int64(math.Min(math.Ceil(rate*c.TargetPeriod.Seconds()), maxGrant))
	limit := max(1, min(int64(math.Floor(c.MaxShare*float64(capacity))), maxGrant))
	want = min(want, limit)
	return max(want, need, 1)
}

// EstimateRate updates a key's rate estimate (tokens/s) from what was
// consumed since the last grant, elapsed ago. It follows a rise at once
// (a hot key must not wait several round trips for big enough grants)
// and halves the distance on a fall. elapsed is taken as at least
// minElapsed, so two requests a microsecond apart do not look like a
// million per second.
func EstimateRate(prev float64, consumed int64, elapsed, minElapsed time.Duration) float64 {
	if consumed < 0 {
		consumed = 0
	}
	elapsed = max(elapsed, minElapsed, time.Microsecond)
	inst := float64(consumed) / elapsed.Seconds()
	return math.Max(inst, (prev+inst)/2)
}

// Watermark is the tokens on hand at or below which a refill starts.
func Watermark(c Config, granted int64) int64 {
	return int64(math.Ceil(c.LowWatermark * float64(granted)))
}

// PaceFraction is the part of TargetPeriod a saturated key's refills are
// spaced by on a node that shares the key's region bucket: it waits until
// its part of the rate has gathered PaceFraction × TargetPeriod worth of
// tokens (see Pace). Lower costs more Redis calls on saturated keys
// (about 2 per PaceFraction × TargetPeriod per node); higher makes
// admissions burstier within a period and comes closer to the bucket's
// fill time, past which refill would be lost at the cap. At the defaults
// one key at 10x its limit through two nodes costs about 1.3 lease calls
// per 1,000 decisions.
const PaceFraction = 0.75

// LonePaceFraction is PaceFraction for a node alone on the bucket (see
// Alone). Its calls are the key's only calls, and what it has not yet
// taken is what it lags an ideal bucket by: refilling every quarter of
// TargetPeriod keeps a saturated key within 3 % of the ideal from its
// first second, for about 4 calls a second (docs/performance.md, "A
// fresh bucket's burst").
const LonePaceFraction = 0.25

// Part is the part of a region bucket's rate (tokens/s) a node counts as
// its own: all of it when it is alone on the bucket; when the bucket is
// contended MaxShare of it, as MaxShare caps a node's part of the burst.
// With two nodes at the default 0.5 each takes half of what gathers
// whatever the phase of their refills.
func Part(c Config, rate float64, alone bool) float64 {
	if alone {
		return rate
	}
	return c.MaxShare * rate
}

// Alone reports whether nobody else took from a region bucket between
// two of a node's answers from it. prev is the whole tokens the earlier
// answer left; gap is the time from that answer's arrival to the sending
// of this call, shorter than the time between the two script runs; rate
// and burst are the bucket's (the lower rate of the two answers); before
// is this answer's left plus its grant. The bucket held at least
// min(burst, prev + rate·gap) when this call ran: if the answer shows a
// whole token less, someone took it (another node, an exact check).
// Takes of under a token between two answers go unseen, and so do RLQS
// clients, whose use is charged only at settlements: an answer says when
// their parts hold the bucket (ItemReply.Shared), and the node is not alone.
func Alone(prev int64, gap time.Duration, rate float64, burst, before int64) bool {
	gathered := math.Min(float64(burst), float64(prev)+rate*max(gap, 0).Seconds())
	return float64(before)+1 > gathered
}

// UsefulGrant is the smallest grant worth a Redis call for a node whose
// recent use of the key is use tokens/s: its part of the rate (use if
// lower: a light user needs less) over PaceFraction × TargetPeriod
// (LonePaceFraction when alone), no more than MaxShare of the burst, at
// least 1.
func UsefulGrant(c Config, rate float64, burst int64, use float64, alone bool) int64 {
	f := PaceFraction
	if alone {
		f = LonePaceFraction
	}
	p := min(Part(c, rate, alone), max(use, 0))
	u := int64(math.Ceil(p * f * c.TargetPeriod.Seconds()))
	return max(1, min(u, int64(math.Floor(c.MaxShare*float64(burst))), maxGrant))
}

// Pace is how long a key's next refill waits after a lease answer: 0 if
// the region bucket (rate tokens/s, burst, left whole tokens after the
// answer) still holds a useful grant for this node (UsefulGrant of use)
// and the answer was not a denial; else the time the node's part of the
// rate takes to gather a useful grant. What is left does not shorten the
// wait: on a contended bucket it is the other nodes' part (counting it
// made a node refill again within a fraction of the pace for a handful of
// tokens). The wait ends PaceSlack before the bucket would be full again
// (at the latest at a quarter of its fill time): refill past the burst is
// lost, so a node that is late by a scheduler stall must not under-admit.
// It is never shorter than retry, a denial's own retry time (the waiting
// cost cannot be served sooner). Requests meanwhile are denied from
// memory; a contended key then costs each node one call per wait instead
// of one per round trip.
func Pace(c Config, rate float64, burst, left int64, use float64, alone bool, retry time.Duration) time.Duration {
	if rate <= 0 {
		return retry
	}
	u := UsefulGrant(c, rate, burst, use, alone)
	left = max(left, 0)
	if left >= u {
		return max(retry, 0)
	}
	wait := time.Duration(float64(u) / Part(c, rate, alone) * float64(time.Second))
	fill := time.Duration(float64(max(burst-left, 0)) / rate * float64(time.Second))
	wait = min(wait, max(fill-PaceSlack, fill/4))
	return max(wait, retry, time.Millisecond)
}

// PaceSlack is how late a paced refill may be (a stalled or busy node)
// before the region bucket fills up and its refill is lost.
const PaceSlack = 50 * time.Millisecond

// PacedWant caps the grant a refill asks for after a paced wait: the
// node's part of what gathered in the region bucket since its last grant,
// elapsed ago, so that two nodes refilling at about the same moment leave
// each other's part in the bucket. It never goes below need or 1.
func PacedWant(c Config, rate float64, elapsed time.Duration, want, need int64, alone bool) int64 {
	part := int64(math.Min(math.Ceil(Part(c, rate, alone)*elapsed.Seconds()), maxGrant))
	return max(min(want, part), need, 1)
}
