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
	weight    map[string]float64 // smoothed demand of the keys this region reports
	lastDrain time.Time
	// The window drain of the epoch starting at windowFor was asked at
	// windowAsk; windowing: its Drained is awaited.
	windowFor, windowAsk time.Time
	windowing            bool
	// base is the last epoch's report, the mid-interval round's base.
	base midBase
}

// drain turns the tokens since the last drain into rates (tokens/s).
func (m *Machine) drain(now time.Time, tokens map[string]float64) map[string]float64 {
	secs := now.Sub(m.reports.lastDrain).Seconds()
	m.reports.lastDrain = now
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
		m.reports.weight[key] = rebalance.Smooth(m.reports.weight[key], rate, k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rate), weight: float32(m.reports.weight[key])})
	}
	for key, s := range m.ledger.own {
		if seen[key] {
			for i := range out {
				if out[i].key == key {
					out[i].share = s
				}
			}
			continue
		}
		if _, ok := m.cfg.Limits.Global(key); !ok {
			delete(m.ledger.own, key) // its policy is gone or no longer global
			continue
		}
		seen[key] = true
		m.reports.weight[key] = rebalance.Smooth(m.reports.weight[key], rates[key], k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rates[key]), weight: float32(m.reports.weight[key]), share: s})
	}
	for key := range m.reports.weight {
		if !seen[key] {
			delete(m.reports.weight, key)
		}
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	return out
}
