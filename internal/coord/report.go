package coord

import (
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/rebalance"
)

// The report builder: the region's drained demand, smoothed, into the
// entries it reports.

// drain turns the tokens since the last drain into rates (tokens/s).
func (m *Machine) drain(now time.Time, tokens map[string]float64) map[string]float64 {
	secs := now.Sub(m.lastDrain).Seconds()
	m.lastDrain = now
	m.noteDemand(tokens, now)
	if secs <= 0 {
		secs = 1e-3
	}
	rates := make(map[string]float64, len(tokens))
	for key, n := range tokens {
		rates[key] = max(0, n) / secs
	}
	return rates
}

// reportEntries builds this region's report: the heavy hitters (demand of
// at least HeavyHitter of the key's fair rate) and every key whose share
// is not the default, so the others keep seeing what this region holds.
func (m *Machine) reportEntries(rates map[string]float64, k Knobs) []entry {
	n := float64(len(m.cfg.Regions))
	var out []entry
	seen := map[string]bool{}
	for key, rate := range rates {
		lim, ok := m.cfg.Limits.Global(key)
		if !ok || rate < k.HeavyHitter*lim.Rate/n || rate == 0 {
			continue
		}
		seen[key] = true
		m.weight[key] = rebalance.Smooth(m.weight[key], rate, k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rate), weight: float32(m.weight[key])})
	}
	for key, s := range m.own {
		if seen[key] {
			for i := range out {
				if out[i].key == key {
					out[i].share = s
				}
			}
			continue
		}
		if _, ok := m.cfg.Limits.Global(key); !ok {
			delete(m.own, key) // its policy is gone or no longer global
			continue
		}
		seen[key] = true
		m.weight[key] = rebalance.Smooth(m.weight[key], rates[key], k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rates[key]), weight: float32(m.weight[key]), share: s})
	}
	for key := range m.weight {
		if !seen[key] {
			delete(m.weight, key)
		}
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	return out
}
