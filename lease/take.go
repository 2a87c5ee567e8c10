package lease

import (
	"context"
	"hash/maphash"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// The take path: a decision from the tokens on hand, and the slow path
// that waits for (or schedules) a refill.

// Take takes cost tokens for the key of lim and subject (the bytes of
// policy.Compiled.AppendSubject). With tokens on hand it neither locks nor
// allocates. With none it joins the key's refill and waits (ctx bounds
// the wait); a Redis failure is returned as an error, and the caller
// decides whether to fail open or closed. It is TakeTo with the Result
// returned.
func (m *Manager) Take(ctx context.Context, lim *Limit, subject []byte, cost int64) (Result, error) {
	var r Result
	err := m.TakeTo(ctx, lim, subject, cost, &r)
	return r, err
}

// TakeTo is Take with the Result written to *r (zeroed first; on an
// error it is left zero). The decision path uses it: a Result is nine
// words, too many to be returned in registers, and copying it back from
// the stack, field stores read by wider loads, cost a third of a leased
// decision (BenchmarkTake's profile).
//
// The common case, a tracked key with tokens on hand, is the straight
// path here: hash, lock-free probe, one CAS, the answer's numbers.
// Everything else (a new key, no tokens, a refill to wait for, the deny
// cache, a cold key) is takeSlow.
func (m *Manager) TakeTo(ctx context.Context, lim *Limit, subject []byte, cost int64, r *Result) error {
	if cost <= lim.capacity {
		var h uint64
		// Concrete calls, not a function value chosen at New: the subject
		// would escape through one (decide's subject buffer moves to the
		// heap, an allocation per leased decision: BenchmarkLeasedDecision),
		// and m.hash is not inlined.
		if m.opts.FixedHash {
			h = fixedHash(subject)
		} else {
			h = maphash.Bytes(m.seed, subject)
		}
		h ^= lim.mix
		warm := false
		if f := m.coldKeys; f != nil && cost > 0 {
			// The cold filter judges a key not leased here without a lookup.
			switch f.take(uint32(h), m.clock.Now(), int64(lim.cfg.TTL)/2, lim.cfg.ColdHits) {
			case filterCold:
				m.stats.exact.Add(1)
				*r = Result{Limit: lim.capacity, Exact: true}
				return nil
			case filterWarm:
				warm = true
			}
		}
		sh := &m.stripes[h>>(64-stripeBits)]
		if e := sh.table.Load().find(h, lim, subject); e != nil {
			if hd := e.held.Load(); hd != nil {
				now := m.clock.Now()
				if t, rest, ok := hd.take(now, cost); ok {
					m.allowed(sh, e, hd, lim, now, cost, rest, t, r)
					return nil
				}
			}
			return m.takeSlow(ctx, lim, subject, cost, 0, h, sh, e, warm, r)
		}
		return m.takeSlow(ctx, lim, subject, cost, 0, h, sh, nil, warm, r)
	}
	*r = Result{Limit: lim.capacity, RetryAfter: algorithm.Never}
	return nil
}

// allowed writes the answer of a take of cost that left rest on hand,
// and queues a refill when rest fell to the watermark. A paced key
// (denyTil ahead) spends what it holds and then is denied: its refill
// waits for the pace to end.
func (m *Manager) allowed(sh *stripe, e *entry, hd *held, lim *Limit, now, cost, rest int64, t ticket, r *Result) {
	if rest <= int64(hd.wm.Load()) && e.flags.Load() == 0 && now >= hd.denyTil.Load() {
		m.schedule(sh, e, 0, 0)
	}
	if hd.demand != nil {
		hd.demand.admitted.Add(cost)
	}
	rem := hd.remaining(lim, rest)
	// Field by field: a composite literal would be built on the stack and
	// copied, the copy TakeTo exists to avoid.
	r.Allowed = true
	r.Limit = lim.capacity
	r.Remaining = rem
	r.ResetAfter = lim.resetAfter(rem)
	r.RetryAfter = 0
	r.Exact = false
	r.h = hd
	r.t = t
}

// takeSlow is TakeTo off the straight path: e is the entry found (nil if
// none), h and sh the key's hash and stripe; warm says the cold filter
// has just judged the key warm (its Take reached ColdHits), so it leases
// without the key table's own count. want > 0 is a batch taker's
// (TakeUpTo): its refill is sized for want, and the deny cache does not
// stop it: the cache spares Redis a call per request, and a batch taker
// makes one per client round, which a pace as long as the round would
// leave with nothing (two clients at the same phase: the second would
// never be served). A pace its own refill set still stops it.
func (m *Manager) takeSlow(ctx context.Context, lim *Limit, subject []byte, cost, want int64, h uint64, sh *stripe, e *entry, warm bool, r *Result) error {
	*r = Result{}
	for attempt := 0; ; attempt++ {
		if e == nil {
			if m.life.closed.Load() {
				return ErrClosed
			}
			sh.mu.Lock()
			e = sh.insert(h, lim, subject, m.coldKeys)
			sh.mu.Unlock()
		}
		hd := e.held.Load()
		if hd == nil && cost <= 0 {
			// A take of nothing succeeds on an empty lease too.
			sh.mu.Lock()
			hd = e.holdLocked(lim, m.coldKeys)
			sh.mu.Unlock()
		}
		now := m.clock.Now()
		var t ticket
		var rest int64
		var ok bool
		if hd != nil {
			t, rest, ok = hd.take(now, cost)
		}
		if ok {
			m.allowed(sh, e, hd, lim, now, cost, rest, t, r)
			return nil
		}
		if m.life.closed.Load() {
			return ErrClosed
		}
		var deny int64
		if hd != nil {
			deny = hd.denyTil.Load()
		}
		if now < deny && (want == 0 || attempt > 0) || attempt >= 3 {
			var rem int64
			if hd != nil {
				if hd.demand != nil {
					hd.demand.denied.Add(cost)
				}
				rem = hd.remaining(lim, rest)
			}
			*r = Result{
				Limit: lim.capacity, Remaining: rem, ResetAfter: lim.resetAfter(rem),
				RetryAfter: time.Duration(max(deny-now, int64(time.Millisecond))),
			}
			return nil
		}
		if m.opts.ColdExact && attempt == 0 && !warm && m.cold(e, lim, now) {
			m.stats.exact.Add(1)
			*r = Result{Limit: lim.capacity, Exact: true}
			return nil
		}
		dead, err := m.await(ctx, sh, e, cost, want)
		if err != nil {
			return err
		}
		if dead {
			e = nil
		}
	}
}

// cold reports whether a Take of e that found no tokens should go to the
// exact path: no refill under way, no lease sent (nor a pace ended)
// within half the TTL, and fewer than ColdHits Takes in the key's current
// window of half the TTL. It counts the Take in e.seen: the window's start
// in the high bits, its Takes in the low 8 (the clock's 256 ns lost).
// Most cold keys never get here: the cold filter counts them the same way
// without an entry (coldFilter); this is the rule for the keys it sends
// to the key table (leased ones, and those of crowded buckets).
func (m *Manager) cold(e *entry, lim *Limit, now int64) bool {
	if e.flags.Load() != 0 {
		return false
	}
	half := int64(lim.cfg.TTL) / 2
	// A leased key stays warm while its last lease call (or the end of a
	// pace: a contended key whose pace outlasts TTL/2 is hot) is recent.
	if hd := e.held.Load(); hd != nil {
		last := hd.denyTil.Load()
		if ce := hd.curExp.Load(); ce != 0 {
			last = max(last, ce-int64(lim.cfg.TTL))
		}
		if last != 0 && now-last <= half {
			return false
		}
	}
	for {
		old := e.seen.Load()
		start, hits := old&^seenHits, old&seenHits
		next := now&^seenHits | 1
		if old != 0 && now-start <= half {
			next = old
			if hits < seenHits {
				next++
			}
		}
		if e.seen.CompareAndSwap(old, next) {
			return next&seenHits < int64(lim.cfg.ColdHits)
		}
	}
}

// seenHits masks the Take count in entry.seen.
const seenHits = 0xff

// MaxColdHits is the largest Config.ColdHits: the count a key's entry
// holds in its low 8 bits.
const MaxColdHits = seenHits

// GiveBack returns the tokens of an allowed Take to this node's lease,
// for a request another limit denied.
func (m *Manager) GiveBack(r *Result) {
	m.GiveBackPart(r, r.t.n)
	r.h = nil
}

// GiveBackPart returns n of the tokens an allowed Take (or TakeUpTo) took
// to this node's lease; the Result keeps the rest (Tokens).
func (m *Manager) GiveBackPart(r *Result, n int64) {
	n = min(n, r.t.n)
	if !r.Allowed || r.h == nil || n <= 0 {
		return
	}
	if !r.h.give(m.clock.Now(), ticket{n: n, exp: r.t.exp}) {
		m.stats.stranded.Add(n)
	}
	if d := r.h.demand; d != nil {
		d.admitted.Add(-n)
	}
	r.t.n -= n
}

// remaining is the honest Remaining of a Result: onHand plus what the
// region bucket held after the last grant, capped at the capacity.
func (e *held) remaining(lim *Limit, onHand int64) int64 {
	return min(lim.capacity, onHand+max(0, int64(e.left.Load())))
}

// resetAfter is the time the region bucket takes from rem to full.
func (l *Limit) resetAfter(rem int64) time.Duration {
	// A multiplication, not a division: this runs on every decision.
	return time.Duration(float64(l.capacity-rem)*l.nsPerToken + 0.999)
}
