package coord

import (
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/rebalance"
)

// The report builder: the region's drained demand, smoothed, into the
// entries it reports.

// reporter is the report builder's state.
type reporter struct {
	regions   int // how many regions share each global limit
	limits    Limits
	weight    map[string]float64 // smoothed demand of the keys this region reports
	lastDrain time.Time
	// The window drain of the epoch starting at windowFor was asked at
	// windowAsk; windowing: its Drained is awaited.
	windowFor, windowAsk time.Time
	windowing            bool
	// base is the last epoch's report, the mid-interval round's base.
	base midBase
}

// rates turns the tokens drained since the last drain into rates
// (tokens/s).
func (r *reporter) rates(now time.Time, tokens map[string]float64) map[string]float64 {
	secs := now.Sub(r.lastDrain).Seconds()
	r.lastDrain = now
	if secs <= 0 {
		secs = 1e-3
	}
	rates := make(map[string]float64, len(tokens))
	for key, n := range tokens {
		rates[key] = max(0, n) / secs
	}
	return rates
}

// entries builds this region's report: the heavy hitters (demand of at
// least HeavyHitter of the key's fair rate) and every key whose share in
// l is not the default, so the others keep seeing what this region holds.
// A key of l whose limit is no longer global is dropped from it.
func (r *reporter) entries(rates map[string]float64, k Knobs, l *ledger) []entry {
	n := float64(r.regions)
	var out []entry
	seen := map[string]bool{}
	for key, rate := range rates {
		lim, ok := r.limits.Global(key)
		if !ok || rate < k.HeavyHitter*lim.Rate/n || rate == 0 {
			continue
		}
		seen[key] = true
		r.weight[key] = rebalance.Smooth(r.weight[key], rate, k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rate), weight: float32(r.weight[key])})
	}
	for key, s := range l.own {
		if seen[key] {
			for i := range out {
				if out[i].key == key {
					out[i].share = s
				}
			}
			continue
		}
		if _, ok := r.limits.Global(key); !ok {
			delete(l.own, key) // its policy is gone or no longer global
			continue
		}
		seen[key] = true
		r.weight[key] = rebalance.Smooth(r.weight[key], rates[key], k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rates[key]), weight: float32(r.weight[key]), share: s})
	}
	for key := range r.weight {
		if !seen[key] {
			delete(r.weight, key)
		}
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	return out
}
