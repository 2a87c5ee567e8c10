package decide

import "sync"

// demand counts, per bucket key, the tokens the exact path (and quota
// clients, QuotaUsage) admitted and denied for global limits since the
// last drain: the coordinator's input
// for shares (token buckets) and for which quota counts to exchange (fixed
// windows). It counts only when Config.Demand says something drains it:
// a key stays until drained. The leased path counts its own
// (lease.Manager.DrainDemand).
type demand struct {
	mu sync.Mutex
	m  map[string]*[2]int64 // key -> admitted, denied
}

// record counts one decided check's global items.
func (dm *demand) record(p *plan, denied bool, cost int64) {
	i := 0
	if denied {
		i = 1
	}
	dm.mu.Lock()
	defer dm.mu.Unlock()
	for gi := range p.groups {
		g := &p.groups[gi]
		if g.shadow {
			continue
		}
		k := 0 // g.items[k] is the item of the limit at hand
		for _, pol := range g.pols {
			if !pol.Global {
				k += len(pol.Limits)
				continue
			}
			for range pol.Limits {
				dm.countLocked(g.items[k].Key)[i] += cost
				k++
			}
		}
	}
}

// add counts admitted and denied tokens of key (a quota client's usage).
func (dm *demand) add(key string, admitted, denied int64) {
	dm.mu.Lock()
	defer dm.mu.Unlock()
	c := dm.countLocked(key)
	c[0] += admitted
	c[1] += denied
}

// countLocked is key's counts, made if new.
func (dm *demand) countLocked(key string) *[2]int64 {
	if dm.m == nil {
		dm.m = map[string]*[2]int64{}
	}
	c := dm.m[key]
	if c == nil {
		c = new([2]int64)
		dm.m[key] = c
	}
	return c
}

// DrainDemand calls fn for every global key the exact path decided since
// the previous call, with the tokens admitted and denied, and forgets
// them. It has the shape of lease.Manager.DrainDemand, so a node publishes
// both to its coordinator.
func (d *Decider) DrainDemand(fn func(key string, admitted, denied int64)) {
	d.demand.mu.Lock()
	m := d.demand.m
	d.demand.m = nil
	d.demand.mu.Unlock()
	for key, c := range m {
		fn(key, c[0], c[1])
	}
}
