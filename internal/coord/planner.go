package coord

import (
	"slices"
	"strings"

	"github.com/allot-dev/allot/rebalance"
)

// planner computes a round's plans from its inputs, the same in every
// region that heard the same reports.
type planner struct {
	self    string   // this region
	regions []string // every region, sorted
	limits  Limits
}

// The planner: each key of a round planned from every region heard.

// plans are an epoch's key plans, in key order. Every key's plan has the
// same regions, heard set and self, so they are kept once and of each key
// only its shares: a million keys' plans are two arrays, not millions of
// small ones.
type plans struct {
	keys    []string
	shares  []rebalance.Share // keys[i]'s Prev, Target and Shrunk, n each, from 3n·i
	self    int
	regions []string
	heard   []bool
}

func (ps *plans) add(key string, kp *rebalance.KeyPlan) {
	if len(ps.keys) == 0 {
		ps.self, ps.regions, ps.heard = kp.Self, slices.Clone(kp.Regions), slices.Clone(kp.Heard)
	}
	ps.keys = append(ps.keys, key)
	ps.shares = append(append(append(ps.shares, kp.Prev...), kp.Target...), kp.Shrunk...)
}

// plan returns keys[i]'s plan, whose slices are the stored ones: to read.
func (ps *plans) plan(i int) rebalance.KeyPlan {
	n := len(ps.regions)
	s := ps.shares[3*n*i : 3*n*(i+1)]
	return rebalance.KeyPlan{Self: ps.self, Regions: ps.regions, Heard: ps.heard, Prev: s[:n:n], Target: s[n : 2*n : 2*n], Shrunk: s[2*n:]}
}

// byKey returns es with one entry per key, in key order: es itself when
// it already is (a report as encodeReport sends it), else a sorted copy in
// which a key's last entry wins, as it would filling a map.
func byKey(es []entry) []entry {
	sorted := true
	for i := 1; i < len(es) && sorted; i++ {
		sorted = es[i-1].key < es[i].key
	}
	if sorted {
		return es
	}
	out := slices.Clone(es)
	slices.SortStableFunc(out, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	w := 0
	for i := range out {
		if i+1 < len(out) && out[i+1].key == out[i].key {
			continue
		}
		out[w] = out[i]
		w++
	}
	return out[:w]
}

// plan runs rebalance.Plan for every key of the heard reports, in key
// order. Every region's inputs are taken exactly as they travel (float32
// demand), so regions with the same heard set compute bit-identical plans.
//
// Each region's inputs are a key-ordered list (its report when heard, its
// last heard report otherwise), walked in step with the others: a merge,
// so an epoch costs no map of its keys, and the plans come out sorted.
func (p *planner) plan(r *round, mine []entry, heard []string, last map[string][]entry, k Knobs) *plans {
	n := len(p.regions)
	def := rebalance.Default(n)
	at := make([]cursor, n)   // each region's list, for the key planned
	next := make([]cursor, n) // the heard lists' keys not planned yet
	isHeard := make([]bool, n)
	most := 0
	for i, name := range p.regions {
		switch a := r.reports[name]; {
		case name == p.self:
			at[i].es, isHeard[i] = byKey(mine), true
		case a != nil && slices.Contains(heard, name):
			at[i].es, isHeard[i] = a.keyed, true
		default:
			at[i].es = last[name]
		}
		if isHeard[i] {
			next[i].es = at[i].es
			most = max(most, len(at[i].es))
		}
	}
	params := rebalance.Params{Floor: k.Floor, Decay: k.Decay, Headroom: k.Headroom}
	ps := &plans{keys: make([]string, 0, most), shares: make([]rebalance.Share, 0, 3*n*most)}
	regions := make([]rebalance.Region, n)
	var kp rebalance.KeyPlan
	for {
		key, found := nextKey(next)
		if !found {
			return ps
		}
		lim, ok := p.limits.Global(key)
		if !ok {
			continue
		}
		for i, name := range p.regions {
			reg := rebalance.Region{Name: name, Heard: isHeard[i], Share: def}
			if e, ok := at[i].find(key); ok {
				if isHeard[i] {
					reg.Demand = rebalance.Demand{Rate: float64(e.rate), Weight: float64(e.weight)}
				}
				if e.share != 0 {
					reg.Share = e.share
				}
			}
			regions[i] = reg
		}
		rebalance.PlanInto(&kp, p.self, regions, lim.Rate, params)
		ps.add(key, &kp)
	}
}

// cursor walks a list of entries (one per key, in key order) for keys
// asked in increasing order.
type cursor struct {
	es []entry
	at int
}

// nextKey is one step of the merge of key-ordered lists: the least key of
// a demand entry at the cursors (quota counts name no key to plan), each
// cursor moved past it; false when every list is done.
func nextKey(cs []cursor) (string, bool) {
	key, found := "", false
	for i := range cs {
		es, at := cs[i].es, cs[i].at
		for at < len(es) && es[at].window != 0 {
			at++
		}
		cs[i].at = at
		if at < len(es) && (!found || es[at].key < key) {
			key, found = es[at].key, true
		}
	}
	if found {
		for i := range cs {
			if es, at := cs[i].es, cs[i].at; at < len(es) && es[at].key == key {
				cs[i].at++
			}
		}
	}
	return key, found
}

// find returns key's demand entry, if the list has one; keys asked later
// must not be smaller.
func (c *cursor) find(key string) (entry, bool) {
	for c.at < len(c.es) && c.es[c.at].key < key {
		c.at++
	}
	if c.at < len(c.es) && c.es[c.at].key == key && c.es[c.at].window == 0 {
		return c.es[c.at], true
	}
	return entry{}, false
}
