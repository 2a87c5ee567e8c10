package coord

import (
	"math"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/rebalance"
)

// The mid-interval round (docs/multi-region.md, "Mid-interval rounds"):
// halfway through an epoch whose reports every region heard, each region
// reports only the keys whose demand moved by more than the headroom of
// their fair share since its epoch report, and the keys any region
// reported are planned again from those fresh figures and, for a region
// that did not report a key, its figures of the epoch. With every region
// heard, a key's targets depend only on those figures, which every region
// holds alike; each region shrinks to at most its target, acks, and grows
// to its target only when every region acked. A region that heard fewer
// than all does nothing, so the others do not grow either.

// midRound is an epoch's mid-interval round: no quota counts, no
// listening, the gathers over half the interval.
type midRound struct{}

// begin skips the round when this region cannot take part: it is not the
// active coordinator, is still listening, or did not hear every region's
// report of the epoch. The others then do not hear it and skip the round
// too.
func (midRound) begin(m *Machine, e *epoch) bool {
	if !m.role.active || m.role.listening || !m.reports.base.all || m.reports.base.epoch != e.id.epoch {
		return false
	}
	e.wantDrain, m.out.Drain = true, true
	return true
}

func (midRound) span(iv time.Duration) time.Duration { return iv / 2 }

// open builds and publishes this region's mid-interval report.
func (midRound) open(m *Machine, e *epoch) {
	e.st = Stats{Epoch: e.id.epoch, Mid: true}
	e.mine = m.reports.midEntries(e.rates, e.k, &m.ledger)
	msgs := m.encodeReport(e, slices.Clip(e.mine))
	for _, msg := range msgs {
		e.st.ReportBytes += proto.Size(msg)
	}
	e.st.Reported, e.st.Chunks = len(e.mine), len(msgs)
	e.r.report = msgs
	m.out.Messages = append(m.out.Messages, msgs...)
	e.stage = stageReports
}

// midEntries is a mid-interval report: the global keys whose demand of
// the window moved since the epoch's report by more than Headroom of
// their fair rate L/n, among those of at least HeavyHitter of it (before
// or now), with their shares in l.
func (r *reporter) midEntries(rates map[string]float64, k Knobs, l *ledger) []entry {
	n := float64(r.regions)
	var out []entry
	consider := func(key string, now float64) {
		lim, ok := r.limits.Global(key)
		if !ok {
			return
		}
		before := 0.0
		if b, ok := findRate(r.base.mine, key); ok {
			before = float64(b.rate)
		}
		fair := lim.Rate / n
		if math.Abs(now-before) <= k.Headroom*fair || max(now, before) < k.HeavyHitter*fair || max(now, before) == 0 {
			return
		}
		s := l.own[key]
		out = append(out, entry{key: key, rate: float32(now), weight: float32(rebalance.Smooth(r.weight[key], now, k.Smoothing)), share: s})
	}
	for key, rate := range rates {
		consider(key, rate)
	}
	for _, b := range r.base.mine {
		if _, ok := rates[b.key]; !ok {
			consider(b.key, 0)
		}
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	return out
}

// shrink is the mid-interval round's first phase, when every region's
// report arrived: plan the reported keys and write the shrunk shares. A
// round that heard fewer, or in which nobody reported a key, ends here.
// Its reports are not remembered as the regions' last (as heard does):
// midPlan falls back on the epoch's.
func (midRound) shrink(m *Machine, e *epoch) {
	e.heard = m.inbox.completeRegions(e.r)
	e.st.Heard = len(e.heard)
	if len(e.heard) < len(m.cfg.Regions) {
		m.done(e)
		return
	}
	e.plans = m.planner.midPlan(e, m.reports.base.mine, m.inbox.last, m.ledger.own)
	e.st.Keys = len(e.plans.keys)
	if len(e.plans.keys) == 0 {
		m.done(e) // every region planned the same nothing: none waits for an ack
		return
	}
	m.writeShrunk(e, false)
}

func (midRound) end(m *Machine, e *epoch) {
	m.out.Round = &Round{Start: e.start, Stats: e.st, Regions: len(m.cfg.Regions)}
	m.log.Debug("coord: mid-interval round", "epoch", e.id.epoch, "heard", e.st.Heard, "group", e.st.Group, "keys", e.st.Keys, "written", e.st.Written)
}

// midPlan plans every key of the mid-interval reports, in key order. A
// region's figures for a key are its mid-interval entry, else its entry of
// the epoch's report, else none (demand 0, the default share). This
// region's own share is the one in force, so it never shrinks below what
// its target will give back; the others' shares may be older in its view,
// which changes only their first phase, never a target.
//
// Every list is in key order, so the keys are merged (nextKey) and looked
// up by cursors that only move forward, as plan does: no sort, no search.
func (p *planner) midPlan(e *epoch, mine []entry, last map[string][]entry, own map[string]rebalance.Share) *plans {
	regions := p.regions
	fresh := make([]cursor, len(regions))
	base := make([]cursor, len(regions))
	next := make([]cursor, len(regions)) // the fresh keys not planned yet
	most := 0
	for i, name := range regions {
		if name == p.self {
			fresh[i].es, base[i].es = e.mine, mine
		} else {
			fresh[i].es, base[i].es = e.r.reports[name].keyed, last[name]
		}
		next[i].es = fresh[i].es
		most = max(most, len(fresh[i].es))
	}
	def := rebalance.Default(len(regions))
	params := rebalance.Params{Floor: e.k.Floor, Decay: e.k.Decay, Headroom: e.k.Headroom}
	ps := &plans{keys: make([]string, 0, most), shares: make([]rebalance.Share, 0, 3*len(regions)*most)}
	rs := make([]rebalance.Region, len(regions))
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
		for i, name := range regions {
			r := rebalance.Region{Name: name, Heard: true, Share: def}
			en, ok := fresh[i].find(key)
			if !ok {
				en, ok = base[i].find(key)
			}
			if ok {
				r.Demand = rebalance.Demand{Rate: float64(en.rate), Weight: float64(en.weight)}
				if en.share != 0 {
					r.Share = en.share
				}
			}
			if name == p.self {
				if s, ok := own[key]; ok {
					r.Share = s
				} else {
					r.Share = def
				}
			}
			rs[i] = r
		}
		rebalance.PlanInto(&kp, p.self, rs, lim.Rate, params)
		ps.add(key, &kp)
	}
}

// findRate returns key's demand entry of es (one entry per key, in key
// order), if it has one.
func findRate(es []entry, key string) (entry, bool) {
	c := cursor{es: es}
	c.at, _ = slices.BinarySearchFunc(es, key, func(e entry, k string) int { return strings.Compare(e.key, k) })
	return c.find(key)
}
