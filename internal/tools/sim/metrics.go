package sim

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// metrics counts what the fleet admitted next to an ideal global bucket
// fed the same arrivals.
type metrics struct {
	regions int
	// Per second, all keys: offered, admitted, ideal.
	offered, admitted, ideal []int64
	// Key 0, the hottest, per region and second, and its ideal.
	hotOffered, hotAdmitted [][]int64
	hotIdeal                []int64
	bound                   boundCheck
	// outsideOpen and outsideLocal count admissions outside the bound's
	// assumptions (on_store_failure open, local), which bound leaves
	// out; withOutside checks the bound on every admission, theirs
	// included (nil without outages), to show what they cost.
	outsideOpen, outsideLocal int64
	withOutside               *boundCheck
	// storeFailed counts the requests decided by on_store_failure.
	storeFailed int64
	// The transports' faults: messages dropped, duplicated, held back.
	dropped, duplicated, heldBack int64
	// The ideal bucket of every key: tokens at ts (ns).
	idealTok []float64
	idealTs  []int64
	rate     float64
	burst    float64

	// pastTTL counts leased admissions that no grant of the node's last
	// TTL covers (node.spent).
	pastTTL int64

	leaseCalls int64
	exactCalls int64
	// leased marks the keys some lease call asked for; keysLeased counts
	// them.
	leased     []bool
	keysLeased int
	maxShares  float64 // largest sum of shares in force of one key, / Unit
}

func newMetrics(c *Config, rate, burst float64) *metrics {
	slots := int((c.Duration+time.Second-1)/time.Second) + 1
	m := &metrics{
		regions: c.Regions, rate: rate, burst: burst,
		offered: make([]int64, slots), admitted: make([]int64, slots), ideal: make([]int64, slots),
		hotIdeal: make([]int64, slots), idealTok: make([]float64, c.Keys), idealTs: make([]int64, c.Keys),
		leased: make([]bool, c.Keys),
	}
	for range c.Regions {
		m.hotOffered = append(m.hotOffered, make([]int64, slots))
		m.hotAdmitted = append(m.hotAdmitted, make([]int64, slots))
	}
	m.bound = newBoundCheck(c.Keys, rate, burst, c.TTL)
	if len(c.Outages) > 0 {
		all := newBoundCheck(c.Keys, rate, burst, c.TTL)
		m.withOutside = &all
	}
	for k := range m.idealTok {
		m.idealTok[k] = burst
	}
	return m
}

// arrived counts a request for key k in region r at now (ns), and decides
// it on the ideal bucket.
func (m *metrics) arrived(r, k int, now int64) {
	slot := now / int64(time.Second)
	m.offered[slot]++
	tok := math.Min(m.burst, m.idealTok[k]+float64(now-m.idealTs[k])*m.rate/1e9)
	m.idealTs[k] = now
	ok := tok >= 1
	if ok {
		tok--
		m.ideal[slot]++
	}
	m.idealTok[k] = tok
	if k == 0 {
		m.hotOffered[r][slot]++
		if ok {
			m.hotIdeal[slot]++
		}
	}
}

// verdict is the fleet's answer to a request.
type verdict uint8

const (
	refused verdict = iota
	allowed
	// allowedOpen and allowedLocal are admissions outside the bound's
	// assumptions: by on_store_failure open, or local (the node's
	// fallback), while the region's Redis was down.
	allowedOpen
	allowedLocal
)

func verdictOf(ok bool) verdict {
	if ok {
		return allowed
	}
	return refused
}

// decided counts the fleet's answer to a request.
func (m *metrics) decided(r, k int, now int64, v verdict) {
	switch v {
	case refused:
		return
	case allowedOpen:
		m.outsideOpen++
	case allowedLocal:
		m.outsideLocal++
	case allowed:
		m.bound.admit(k, now, 1)
	}
	if m.withOutside != nil {
		m.withOutside.admit(k, now, 1)
	}
	slot := now / int64(time.Second)
	m.admitted[slot]++
	if k == 0 {
		m.hotAdmitted[r][slot]++
	}
}

// shareSum notes the sum over the regions of the rates key k's buckets
// enforce, over L's (Theorem 1: never past 1).
func (m *metrics) shareSum(s *Sim, k int) {
	var sum float64
	for _, reg := range s.regions {
		sum += reg.store.rate(s.now/1000, k, s.nodeSpec.Rate())
	}
	m.maxShares = max(m.maxShares, sum/m.rate)
}

// boundCheck checks ARCHITECTURE.md's Theorem 2 on every key and every
// window at once: a window of length T may admit L.burst + L.rate·(T +
// TTL + δ). As the bound is linear in T, a window breaks it exactly when
// its admissions less L.rate·T exceed fixed = L.burst + L.rate·(TTL + δ),
// and the largest such difference over the windows ending at an
// admission follows from the last one's: x ← max(x − r·dt, 0) + cost (the
// best window either extends the previous best or starts anew). 24 bytes
// per key.
type boundCheck struct {
	x        []float64 // the best window's admissions less r·T, at its end
	at, from []int64   // its end (the key's last admission) and start, ns
	rate     float64   // L.rate per ns
	fixed    float64
	worst    float64 // the largest (admitted − bound)/bound of a best window
	where    string
	admitted int // keys admitted at least once
}

// boundDelta is the δ of the bound: the arrival tick, as before.
const boundDelta = time.Millisecond

func newBoundCheck(keys int, rate, burst float64, ttl time.Duration) boundCheck {
	return boundCheck{
		x: make([]float64, keys), at: make([]int64, keys), from: make([]int64, keys),
		rate: rate / 1e9, fixed: burst + rate*(ttl+boundDelta).Seconds(), worst: math.Inf(-1),
	}
}

func (b *boundCheck) admit(k int, now int64, cost float64) {
	if b.x[k] == 0 {
		b.admitted++ // x > 0 from the first admission on
	}
	x := b.x[k] - b.rate*float64(now-b.at[k])
	if x <= 0 {
		x, b.from[k] = 0, now
	}
	x += cost
	b.x[k], b.at[k] = x, now
	t := float64(now - b.from[k])
	bound := b.fixed + b.rate*t
	if f := (x - b.fixed) / bound; f > b.worst {
		b.worst = f
		b.where = fmt.Sprintf("key %d, %.3fs window ending %.3fs: %.0f admitted, bound %.0f", k, t/1e9, float64(now)/1e9, x+b.rate*t, bound)
	}
}

// hotTotal is key 0's admissions over all regions in slot s.
func (m *metrics) hotTotal(s int) int64 {
	var n int64
	for r := range m.hotAdmitted {
		n += m.hotAdmitted[r][s]
	}
	return n
}

// smoothS is the trailing window, in seconds, over which converged and
// underserved compare admissions: a saturated key's admissions per second
// swing by ±25 % with its nodes' pacing cycle (3 s at the defaults: 72,
// 113, 113 per region), which a single second would read as an outage.
const smoothS = 6

// trailing sums xs over the smoothS seconds ending at s, from first on.
func trailing(xs []int64, first, s int) int64 {
	var n int64
	for i := max(first, s-smoothS+1); i <= s; i++ {
		n += xs[i]
	}
	return n
}

// converged is the seconds from `from` until key 0's admissions (all
// regions, trailing smoothS seconds) stay at or above 95 % of the ideal
// bucket's up to end (-1 if they do not by end).
func (m *metrics) converged(from, end time.Duration) float64 {
	first := int((from + time.Second - 1) / time.Second)
	last := int(end/time.Second) - 1 // whole seconds only
	total := make([]int64, last+1)
	for s := range total {
		total[s] = m.hotTotal(s)
	}
	ok := last + 1
	for s := last; s >= first; s-- {
		if float64(trailing(total, first, s)) < 0.95*float64(trailing(m.hotIdeal, first, s)) {
			break
		}
		ok = s
	}
	if ok > last {
		return -1
	}
	// The first second of the window that stays good.
	return float64(max(first, ok-smoothS+1)) - from.Seconds()
}

// underserved counts the (region, second) pairs in which a region was
// served less than 95 % of its max-min fair part of what the ideal bucket
// admitted for key 0 (both over the trailing smoothS seconds): a region
// asking less than an even part is owed all it asked.
func (m *metrics) underserved(end time.Duration) int {
	n := 0
	want := make([]float64, m.regions)
	for s := range int(end / time.Second) {
		for r := range want {
			want[r] = float64(trailing(m.hotOffered[r], 0, s))
		}
		fair := waterFill(want, float64(trailing(m.hotIdeal, 0, s)))
		for r := range want {
			if float64(trailing(m.hotAdmitted[r], 0, s)) < 0.95*fair[r]-0.5 {
				n++
			}
		}
	}
	return n
}

// waterFill is the max-min fair split of total among demands.
func waterFill(want []float64, total float64) []float64 {
	out := make([]float64, len(want))
	idx := make([]int, len(want))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return want[idx[a]] < want[idx[b]] })
	left := total
	for j, i := range idx {
		even := left / float64(len(idx)-j)
		out[i] = math.Min(want[i], even)
		left -= out[i]
	}
	return out
}
