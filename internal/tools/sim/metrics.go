package sim

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// binNs is the resolution of the overshoot check: the tracked keys'
// admissions are counted per bin, and windows are whole runs of bins.
const binNs = int64(10 * time.Millisecond)

// windowBins are the window lengths checked against the bound, in bins:
// 10 ms, 100 ms, 1 s, 10 s.
var windowBins = []int{1, 10, 100, 1000}

// metrics counts what the fleet admitted next to an ideal global bucket
// fed the same arrivals.
type metrics struct {
	regions int
	// Per second, all keys: offered, admitted, ideal.
	offered, admitted, ideal []int64
	// Key 0, the hottest, per region and second, and its ideal.
	hotOffered, hotAdmitted [][]int64
	hotIdeal                []int64
	// tracked[k][bin]: admissions of key k (< Config.Track), all regions.
	tracked [][]int32
	// The ideal bucket of every key: tokens at ts (ns).
	idealTok []float64
	idealTs  []int64
	rate     float64
	burst    float64

	leaseCalls int64
	exactCalls int64
	maxShares  float64 // largest sum of shares in force of one key, / Unit
}

func newMetrics(c *Config, rate, burst float64) *metrics {
	slots := int((c.Duration+time.Second-1)/time.Second) + 1
	m := &metrics{
		regions: c.Regions, rate: rate, burst: burst,
		offered: make([]int64, slots), admitted: make([]int64, slots), ideal: make([]int64, slots),
		hotIdeal: make([]int64, slots), idealTok: make([]float64, c.Keys), idealTs: make([]int64, c.Keys),
	}
	for range c.Regions {
		m.hotOffered = append(m.hotOffered, make([]int64, slots))
		m.hotAdmitted = append(m.hotAdmitted, make([]int64, slots))
	}
	bins := int(int64(c.Duration)/binNs) + 1
	for range min(c.Track, c.Keys) {
		m.tracked = append(m.tracked, make([]int32, bins))
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

// decided counts the fleet's answer to a request.
func (m *metrics) decided(r, k int, now int64, allowed bool) {
	if !allowed {
		return
	}
	slot := now / int64(time.Second)
	m.admitted[slot]++
	if k == 0 {
		m.hotAdmitted[r][slot]++
	}
	if k < len(m.tracked) {
		m.tracked[k][now/binNs]++
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

// overshoot is the worst window's admissions over the documented bound
// (ARCHITECTURE.md, Theorem 2: L.burst + L.rate·(T + TTL + tick)), as a
// fraction of the bound, over the tracked keys and windowBins. A run of
// w bins spans at most w·binNs, so its count is what some window of that
// length admitted: a positive result is a real violation.
func (m *metrics) overshoot(ttl time.Duration) (worst float64, where string) {
	worst = math.Inf(-1)
	for k, bins := range m.tracked {
		for _, w := range windowBins {
			if w > len(bins) {
				continue
			}
			t := time.Duration(int64(w) * binNs)
			bound := m.burst + m.rate*(t+ttl+time.Millisecond).Seconds()
			var sum int64
			for i, n := range bins {
				sum += int64(n)
				if i >= w {
					sum -= int64(bins[i-w])
				}
				if i < w-1 {
					continue
				}
				if f := (float64(sum) - bound) / bound; f > worst {
					worst = f
					where = fmt.Sprintf("key %d, %v window ending %.2fs: %d admitted, bound %.0f", k, t, float64(int64(i+1)*binNs)/1e9, sum, bound)
				}
			}
		}
	}
	return worst, where
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
