package coord

import (
	"github.com/allot-dev/allot/rebalance"
)

// The share ledger: the shares this region owns, the updates planned
// to them and their record once written.

// ledger is the shares in force this region owns, when not the default.
type ledger struct {
	def    rebalance.Share // the default share, what a key not in own holds
	limits Limits
	own    map[string]rebalance.Share
	unsure map[string]bool // keys whose last write failed: Redis may hold another share
}

// takeOver records this region's shares as read from Redis by a new
// active coordinator.
func (l *ledger) takeOver(shares map[string]rebalance.Share) {
	for key, s := range shares {
		if s != l.def {
			l.own[key] = s
		}
	}
}

// forget drops every share: they are the next active coordinator's to
// read.
func (l *ledger) forget() {
	clear(l.own)
	clear(l.unsure)
}

// updates lists the keys whose share pick(plan) differs from the one in
// force, sorted by key (as the plans are). With refresh it also lists the
// unchanged shares that are not the default: rewriting them every epoch
// re-creates a bucket that expired while idle (its share would otherwise
// fall back to the default, which may be more than this region holds) and
// renews TTLs; so are the keys whose last write failed, the default
// included (the bucket may hold less than what is recorded, until it is
// rewritten).
func (l *ledger) updates(ps *plans, pick func(rebalance.KeyPlan) rebalance.Share, k Knobs, refresh bool) []ShareUpdate {
	def := l.def
	// The writes are found first, then listed in one allocation of their
	// final size: growing a list of a million updates copies it many
	// times over.
	type write struct {
		plan     int32
		now, cur rebalance.Share
	}
	ws := make([]write, 0, len(ps.keys))
	for i, key := range ps.keys {
		kp := ps.plan(i)
		if kp.Self < 0 {
			continue
		}
		s := pick(kp)
		cur, ok := l.own[key]
		if !ok {
			cur = def
		}
		if s == cur && (!refresh || (!ok && !l.unsure[key])) {
			continue
		}
		ws = append(ws, write{int32(i), s, cur})
	}
	if len(ws) == 0 {
		return nil
	}
	out := make([]ShareUpdate, len(ws))
	for i, w := range ws {
		key := ps.keys[w.plan]
		lim, _ := l.limits.Global(key)
		old := Limit{Rate: w.cur.Of(lim.Rate), Burst: w.cur.Of(lim.Burst)}
		out[i] = ShareUpdate{Key: key, Share: w.now, Global: lim, Old: old, TTL: k.ShareTTL}
	}
	return out
}

// record notes the outcome of writing us. On failure some writes may have
// landed: each key is then recorded at the larger of its old and new
// share, so what this region reports never under-states what it may
// enforce. It reports whether the writes succeeded.
func (l *ledger) record(us []ShareUpdate, err error) bool {
	def := l.def
	for _, u := range us {
		if err != nil {
			l.unsure[u.Key] = true
		} else {
			delete(l.unsure, u.Key)
		}
		cur, ok := l.own[u.Key]
		if !ok {
			cur = def
		}
		if err != nil && u.Share < cur {
			continue
		}
		if u.Share == def {
			delete(l.own, u.Key)
		} else {
			l.own[u.Key] = u.Share
		}
	}
	return err == nil
}
