package coord

import (
	"context"
	"maps"
	"slices"
	"time"
)

// Global quotas (fixed windows with scope: global, e.g. daily or monthly)
// are not shared like rates: every region counts its own use in its own
// bucket, reports that count, and writes the sum of the other regions'
// counts into its bucket, where check.lua adds it to the local count. A
// region therefore admits while local + remote + cost <= L. What the
// others served since their last report is unknown to it: that lag is the
// whole overshoot (docs/multi-region.md, "Global quotas").

// QuotaStore is the region's Redis for global quotas.
type QuotaStore interface {
	// ReadCounts returns this region's count of each key, in the window
	// the bucket holds; keys without a count are left out.
	ReadCounts(ctx context.Context, keys []string) (map[string]QuotaCount, error)
	// WriteRemote stores the other regions' summed counts in each bucket.
	// A bucket keeps the larger of what it holds and what is written for
	// the same window, so a late or reordered write never lowers it.
	WriteRemote(ctx context.Context, us []RemoteCount) error
}

// QuotaCount is a count of tokens in window number Window
// (floor(Redis time / the quota's period)).
type QuotaCount struct {
	Window int64
	Used   uint64
}

// RemoteCount is the other regions' count of Key in Window.
type RemoteCount struct {
	Key    string
	Window int64
	Used   uint64
	Period time.Duration
}

// quotas is the machine's quota state.
type quotas struct {
	local   map[string]time.Time             // keys used here -> when last used
	heard   map[string]map[string]QuotaCount // key -> region -> last count heard
	written map[string]QuotaCount            // key -> remote sum in force here
}

func newQuotas() quotas {
	return quotas{local: map[string]time.Time{}, heard: map[string]map[string]QuotaCount{}, written: map[string]QuotaCount{}}
}

// reset forgets everything (the lock was lost: the next active region
// rebuilds it from the next reports, which carry whole counts).
func (q *quotas) reset() {
	clear(q.local)
	clear(q.heard)
	clear(q.written)
}

// noteUsed remembers the global quota keys this region's nodes used.
func (m *Machine) noteUsed(tokens map[string]float64, now time.Time) {
	if m.cfg.Quotas == nil {
		return
	}
	for key := range tokens {
		if _, ok := m.cfg.Quotas.Quota(key); ok {
			m.quota.local[key] = now
		}
	}
}

// quotaKeys lists, sorted, the quota keys whose counts this epoch reads.
// Keys not used for a whole window plus an interval are forgotten
// (their count cannot matter any more).
func (m *Machine) quotaKeys(now time.Time, k Knobs) []string {
	if m.cfg.Quotas == nil || len(m.quota.local) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m.quota.local))
	for key, seen := range m.quota.local {
		q, ok := m.cfg.Quotas.Quota(key)
		if !ok || now.Sub(seen) > q.Window+k.Interval {
			delete(m.quota.local, key)
			continue
		}
		keys = append(keys, key)
	}
	slices.Sort(keys)
	return keys
}

// quotaReport returns the counts that travel: at least QuotaThreshold of
// L/n.
func (m *Machine) quotaReport(counts map[string]QuotaCount, k Knobs) []entry {
	if m.cfg.Quotas == nil {
		return nil
	}
	n := float64(len(m.cfg.Regions))
	var out []entry
	for _, key := range slices.Sorted(maps.Keys(counts)) {
		qc := counts[key]
		q, ok := m.cfg.Quotas.Quota(key)
		if !ok || qc.Used == 0 || float64(qc.Used) < k.QuotaThreshold*float64(q.Limit)/n {
			continue
		}
		out = append(out, entry{key: key, window: qc.Window, used: qc.Used})
	}
	return out
}

// fileQuotas keeps the latest count of every heard region (a newer window
// replaces an older one; within a window the larger count wins, counts
// only grow) and drops keys whose policy is gone.
func (m *Machine) fileQuotas(r *round, heard []string) {
	if m.cfg.Quotas == nil {
		return
	}
	for _, name := range heard {
		a := r.reports[name]
		if a == nil || name == m.cfg.Region {
			continue
		}
		for _, e := range a.entries {
			if e.window == 0 {
				continue
			}
			if _, ok := m.cfg.Quotas.Quota(e.key); !ok {
				continue
			}
			qm := m.quota.heard[e.key]
			if qm == nil {
				qm = map[string]QuotaCount{}
				m.quota.heard[e.key] = qm
			}
			old := qm[name]
			if e.window > old.Window || (e.window == old.Window && e.used > old.Used) {
				qm[name] = QuotaCount{Window: e.window, Used: e.used}
			}
		}
	}
}

// quotaUpdates sums, per key, the other regions' counts of the newest
// window heard and lists the sums that raise what is in force. A region
// not heard this epoch still counts with its last count: it may have
// served more since, never less. Keys whose newest window ended more than
// a window ago are forgotten.
func (m *Machine) quotaUpdates(now time.Time) []RemoteCount {
	if m.cfg.Quotas == nil {
		return nil
	}
	var out []RemoteCount
	for _, key := range slices.Sorted(maps.Keys(m.quota.heard)) {
		q, ok := m.cfg.Quotas.Quota(key)
		if !ok || q.Window <= 0 {
			delete(m.quota.heard, key)
			delete(m.quota.written, key)
			continue
		}
		var sum QuotaCount
		for _, qc := range m.quota.heard[key] {
			switch {
			case qc.Window > sum.Window:
				sum = qc
			case qc.Window == sum.Window:
				sum.Used += qc.Used
			}
		}
		if cur := now.UnixNano() / q.Window.Nanoseconds(); sum.Window < cur-1 {
			delete(m.quota.heard, key)
			delete(m.quota.written, key)
			continue
		}
		w := m.quota.written[key]
		if sum.Window < w.Window || (sum.Window == w.Window && sum.Used <= w.Used) {
			continue
		}
		out = append(out, RemoteCount{Key: key, Window: sum.Window, Used: sum.Used, Period: q.Window})
	}
	return out
}

// recordQuotas notes the outcome of writing us: on failure nothing is
// recorded, so the next epoch writes again.
func (m *Machine) recordQuotas(us []RemoteCount, err error) {
	if err != nil {
		m.log.Warn("coord: write quota counts", "n", len(us), "err", err)
		return
	}
	for _, u := range us {
		m.quota.written[u.Key] = QuotaCount{Window: u.Window, Used: u.Used}
	}
}
