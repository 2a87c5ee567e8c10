package rlqs

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/rebalance"
	"github.com/allot-dev/allot/region"
)

// Ledger settles this node's parts of region buckets: region.Store.
type Ledger interface {
	Settle(ctx context.Context, items []region.Settlement) ([]region.Settled, error)
}

// Fixed settings of the split (ARCHITECTURE.md, "Fixed settings").
const (
	// settleEvery is how often the node looks for keys to settle, and the
	// shortest period of a key's settlements: a key is settled once per
	// reporting interval of its clients here (keyState.due), one Redis
	// call per region key per node per interval.
	settleEvery = time.Second
	// minHorizon is the shortest time the bucket's tokens on hand are
	// spread over (avail = rate + tokens / horizon, lua/part.lua): the
	// horizon is the longest reporting interval among the key's consumers
	// here, the time a part is spent for before the next is sent.
	minHorizon = time.Second
	// hysteresis is how far a consumer's fair part may move before it is
	// sent a new strategy: within it the strategy is sent byte-identical,
	// so Envoy keeps its bucket and the tokens in it.
	hysteresis = 0.05
	// floorFraction of the equal split is every live consumer's floor, so
	// an idle bucket is not denied for being idle.
	floorFraction = 0.1
	// growth: a consumer whose leases were short (they asked for more
	// than was granted) or whose offered rate is unknown asks for the
	// whole rate; one that was served asks
	// for what it used times growth.
	growth = 1.25
)

// consumer is one stream bucket's claim on one region key (tokens/s).
type consumer struct {
	seq      uint64        // order of arrival, for a stable order
	gone     bool          // its stream ended: kept, offering nothing, until its part expires
	offered  float64       // offered rate; +Inf until a report shows it
	interval time.Duration // its client's reporting interval
	sent     float64       // the part last sent to the client
	until    time.Time
	part     float64 // the part the last settlement granted
	share    float64 // its fair share of avail at the last settlement
	ready    bool    // a settlement has granted it a part
	now      bool    // answered by the report being settled
	// accrued is what the settlements since its last report charged for
	// it, estimated (accrue), until accruedAt; its next report charges the
	// difference to what it admitted.
	accrued   float64
	accruedAt time.Time
	// moved wakes the stream that owns it when a settlement moves its
	// part past hysteresis from what was sent (buffered, never blocks).
	moved chan<- struct{}
}

// wake tells c's stream that its part moved, if it did.
func (c *consumer) wake() {
	if c.moved == nil || c.now || c.gone || !c.ready {
		return
	}
	if c.sent == 0 && c.part == 0 || c.sent > 0 && math.Abs(c.part-c.sent) <= hysteresis*c.sent {
		return
	}
	select {
	case c.moved <- struct{}{}:
	default: // already woken
	}
}

// accrue charges ks for what c is taken to have admitted since it was
// last charged: at the rate of its part, or of its offered rate if smaller.
// Clients report every few seconds; charging only then would leave the
// bucket seconds behind what its consumers spend, and the split, which
// reads the bucket's tokens, would swing with each report.
func (ks *keyState) accrue(c *consumer, now time.Time) {
	if c.accruedAt.IsZero() || !now.After(c.accruedAt) {
		return
	}
	r := c.held(now)
	if c.gone {
		r = 0
	}
	est := min(r, finite(c.offered, r)) * now.Sub(c.accruedAt).Seconds()
	c.accrued += est
	ks.usage += est
	c.accruedAt = now
}

// held is the part the client may still spend at now.
func (c *consumer) held(now time.Time) float64 {
	if now.Before(c.until) {
		return c.sent
	}
	return 0
}

// keyState is this node's view of one region key with RLQS consumers.
type keyState struct {
	key  decide.QuotaKey
	cons map[*consumer]struct{}
	// usage is the tokens this node's clients admitted since the last
	// settlement (or were taken to, accrue), charged then; negative when
	// a report showed fewer than were charged for it.
	usage float64
	last  time.Time // the last settlement; zero: never
	// view is the last settlement's answer: what the next fair split
	// starts from.
	avail      float64
	others     []float64
	leaseRate  float64
	leaseUnmet bool
	settled    bool
	// moved: the view the last settlement brought back gives other
	// shares than those it applied (computed from the view before).
	moved    bool
	err      error         // the last settlement's error
	inflight chan struct{} // closed when the settlement under way ends
}

// splitter holds this node's keys with RLQS consumers.
type splitter struct {
	mu     sync.Mutex
	keys   map[string]*keyState
	node   string
	ledger Ledger
}

var errNoLedger = errors.New("rlqs: this node has no region store to settle parts in")

func newSplitter(node string, l Ledger) *splitter {
	return &splitter{keys: map[string]*keyState{}, node: node, ledger: l}
}

// join adds c to key k with its offered rate (tokens/s) and its client's
// reporting interval.
func (s *splitter) join(k decide.QuotaKey, c *consumer, offered float64, interval time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.offered, c.interval = offered, interval
	ks := s.keys[k.Key]
	if ks == nil {
		ks = &keyState{key: k, cons: map[*consumer]struct{}{}}
		s.keys[k.Key] = ks
	}
	ks.key = k // a reload may have changed the numbers
	ks.cons[c] = struct{}{}
}

// leave removes c from key k once its part has expired; until then it
// stays reserved, offering nothing (a stream that dies keeps its part until
// its assignment's TTL ends).
func (s *splitter) leave(key string, c *consumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.offered, c.gone = 0, true
	if ks := s.keys[key]; ks != nil && c.until.IsZero() {
		delete(ks.cons, c)
	}
}

// use records what a report says c's client admitted of key (tokens)
// since its last report, less what settlements have charged for it since.
func (s *splitter) use(key string, c *consumer, admitted int64, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.keys[key]; ks != nil {
		ks.usage += float64(admitted) - c.accrued
		c.accrued, c.accruedAt = 0, now
	}
}

// settle settles every key of keys whose last settlement is settleEvery
// old, in one pipelined call, and returns the keys' states. Keys whose
// settlement failed carry the error. answering are the consumers the
// caller answers with this settlement's parts.
func (s *splitter) settle(ctx context.Context, now time.Time, keys []string, answering []*consumer) map[string]*keyState {
	s.mu.Lock()
	for _, c := range answering {
		c.now = true
	}
	out := make(map[string]*keyState, len(keys))
	var items []region.Settlement
	var due []*keyState
	var order [][]*consumer
	var others []chan struct{} // settlements under way for another report
	for _, k := range keys {
		ks := s.keys[k]
		if ks == nil || out[k] != nil {
			continue
		}
		out[k] = ks
		if ks.inflight != nil {
			others = append(others, ks.inflight)
			continue
		}
		if !ks.last.IsZero() && !ks.due(now) {
			continue
		}
		ks.last = now
		ks.inflight = make(chan struct{})
		cs := ks.prune(now)
		for _, c := range cs {
			ks.accrue(c, now)
		}
		wants := ks.wants(cs)
		// The record (and the bucket) live past the next report of the
		// slowest consumer, whose answer renews the parts.
		it := region.Settlement{Key: k, Spec: ks.key.Spec, Node: s.node, Usage: int64(math.Round(ks.usage)), TTL: 3 * settleEvery, Horizon: minHorizon, Hysteresis: hysteresis}
		for i, c := range cs {
			c.share = wants[i]
			it.Consumers = append(it.Consumers, region.Consumer{Offered: finite(c.offered, ks.ceiling()), Held: c.held(now), Share: wants[i]})
			it.TTL = max(it.TTL, c.until.Sub(now)+settleEvery, 2*c.interval+settleEvery)
			it.Horizon = max(it.Horizon, c.interval)
		}
		ks.usage -= float64(it.Usage) // the rounding is charged next time
		items = append(items, it)
		due = append(due, ks)
		order = append(order, cs)
	}
	s.sweepLocked(now)
	s.mu.Unlock()
	if len(items) > 0 {
		var res []region.Settled
		err := errNoLedger
		if s.ledger != nil {
			res, err = s.ledger.Settle(ctx, items)
		}
		s.mu.Lock()
		for i, ks := range due {
			r := region.Settled{Err: err}
			if err == nil {
				r = res[i]
			}
			close(ks.inflight)
			ks.inflight = nil
			if r.Err != nil {
				ks.usage += float64(items[i].Usage) // charged next time
				ks.err = r.Err
				continue
			}
			ks.err = nil
			ks.settled = true
			ks.avail, ks.others, ks.leaseRate, ks.leaseUnmet = r.Avail, r.Others, r.LeaseRate, r.LeaseUnmet
			ks.moved = false
			for j, w := range ks.wants(order[i]) {
				if c := order[i][j]; math.Abs(w-c.share) > hysteresis*max(w, c.share) {
					ks.moved = true
				}
			}
			for j, c := range order[i] {
				c.part, c.ready = r.Parts[j], true
				c.wake()
			}
		}
		s.mu.Unlock()
	}
	for _, ch := range others {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	s.mu.Lock()
	for _, c := range answering {
		c.now = false
	}
	s.mu.Unlock()
	return out
}

// due says whether ks is settled now: once per the shortest reporting
// interval of its consumers here (at least settleEvery), and at once when
// a consumer has joined (to answer it with a part) or the reservation of
// one that left has ended (to hand its part out).
func (ks *keyState) due(now time.Time) bool {
	every := maxInterval
	if ks.moved {
		// The shares were computed from a view the settlement showed to
		// be old: again at the next tick, from the new one.
		return true
	}
	if ks.leaseRate > 0 || ks.leaseUnmet {
		// The leases of CheckRateLimit take the bucket's tokens as they
		// come: charged only each interval, the clients' use would leave
		// them tokens the parts are owed, then a debt that holds them back.
		every = settleEvery
	}
	for c := range ks.cons {
		if !c.gone && !c.ready || c.gone && !now.Before(c.until) {
			return true
		}
		every = min(every, c.interval)
		if !c.gone && c.part < c.share*ks.avail*(1-hysteresis) {
			// Short of its fair part (the room is held elsewhere): each
			// second until the holders' nodes have given it back.
			every = settleEvery
		}
	}
	// Half a tick early: ticks come each settleEvery, so a key is
	// settled every interval, not every interval and a tick.
	return now.Sub(ks.last) >= max(every-settleEvery/2, settleEvery)
}

// sweepPerSettle is how many keys a settlement looks at for ones whose
// consumers have all left: map order is random, so every key is visited
// in time while RLQS traffic goes on.
const sweepPerSettle = 8

// sweepLocked forgets a few keys that have no consumer left.
func (s *splitter) sweepLocked(now time.Time) {
	n := 0
	for k, ks := range s.keys {
		if n++; n > sweepPerSettle {
			return
		}
		if ks.inflight == nil && len(ks.prune(now)) == 0 {
			delete(s.keys, k)
		}
	}
}

// prune drops consumers that left and whose parts expired, and returns
// the others in a stable order.
func (ks *keyState) prune(now time.Time) []*consumer {
	cs := make([]*consumer, 0, len(ks.cons))
	for c := range ks.cons {
		if c.gone && !now.Before(c.until) {
			delete(ks.cons, c)
			continue
		}
		cs = append(cs, c)
	}
	// Map order is random; a stable order keeps the split's rounding
	// and the record's bytes still when nothing moved.
	slices.SortFunc(cs, func(a, b *consumer) int { return cmp.Compare(a.seq, b.seq) })
	return cs
}

// ceiling is the most the key's bucket can give (its rate and its burst
// over the shortest horizon): what a consumer whose offered rate is
// unknown asks.
func (ks *keyState) ceiling() float64 {
	return ks.key.Spec.Rate() + float64(ks.key.Spec.Capacity())/minHorizon.Seconds()
}

// wants is each consumer's fair share of what the key's bucket can give
// (a fraction, which part.lua applies to avail as it is then) among every
// consumer the last settlement showed: the other nodes', this node's, and
// the leases' (as one), split by rebalance.Fair (each consumer's offered
// rate standing as its Demand) with a floor per consumer. keepHeld (-1) marks a stream that ended: its part stays
// reserved until its assignment's TTL.
func (ks *keyState) wants(cs []*consumer) []float64 {
	avail := ks.avail
	if !ks.settled {
		// Before the first settlement; part.lua grants only the room
		// there is.
		avail = ks.ceiling()
	}
	ds := make([]rebalance.Demand, 0, len(ks.others)+len(cs)+1)
	for _, d := range ks.others {
		ds = append(ds, rebalance.Demand{Rate: d, Weight: d})
	}
	for _, c := range cs {
		d := finite(c.offered, ks.ceiling())
		if c.gone {
			d = 0
		}
		ds = append(ds, rebalance.Demand{Rate: d, Weight: d})
	}
	if ks.leaseUnmet || ks.leaseRate > 0 {
		d := ks.leaseRate * growth
		if ks.leaseUnmet {
			d = avail
		}
		ds = append(ds, rebalance.Demand{Rate: d, Weight: d})
	}
	shares := rebalance.Fair(rebalance.Unit, avail, rebalance.FloorShare(len(ds), floorFraction), ds)
	out := make([]float64, len(cs))
	for i, c := range cs {
		out[i] = shares[len(ks.others)+i].Of(1)
		if c.gone {
			out[i] = keepHeld
		}
	}
	return out
}

// keepHeld is the share that keeps a consumer's held part (lua/part.lua).
const keepHeld = -1

// finite is d, or all when d is unknown (+Inf) or not a number.
func finite(d, all float64) float64 {
	if math.IsInf(d, 0) || math.IsNaN(d) {
		return max(all, 0)
	}
	return max(d, 0)
}

// current is the last settlement of each of keys this node splits.
func (s *splitter) current(keys []string) map[string]*keyState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]*keyState, len(keys))
	for _, k := range keys {
		if ks := s.keys[k]; ks != nil {
			out[k] = ks
		}
	}
	return out
}

// count is how many of this node's consumers the first of keys has.
func (s *splitter) count(keys []decide.QuotaKey) int {
	if len(keys) == 0 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.keys[keys[0].Key]; ks != nil {
		return len(ks.cons)
	}
	return 0
}

// claim records that cs were sent part (tokens/s) until until.
func (s *splitter) claim(cs map[string]*consumer, part float64, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		c.sent, c.until = part, until
	}
}

// part is the smallest of cs's granted parts (tokens/s), or the first
// settlement error among their keys.
func (s *splitter) part(cs map[string]*consumer, states map[string]*keyState) (float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := math.Inf(1)
	for k, c := range cs {
		if ks := states[k]; ks != nil && ks.err != nil {
			return 0, ks.err
		}
		p = min(p, c.part)
	}
	return p, nil
}

// run settles, at each tick until ctx ends, every key that is due
// (keyState.due): parts move, and are sent, between reports. beat runs
// first at each tick.
func (s *splitter) run(ctx context.Context, now func() time.Time, ticks <-chan time.Time, beat func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		beat()
		s.mu.Lock()
		keys := make([]string, 0, len(s.keys))
		for k := range s.keys {
			keys = append(keys, k)
		}
		s.mu.Unlock()
		if len(keys) > 0 {
			s.settle(ctx, now(), keys, nil)
		}
	}
}
