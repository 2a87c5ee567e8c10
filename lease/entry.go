package lease

import (
	"sync/atomic"
	"time"
)

// entry is one tracked key. Its size is the per-key memory cost of a
// key that is tracked but holds no lease (48 bytes; see
// BenchmarkMemoryPerKey): with Options.ColdExact a key the cold filter
// could not count (its bucket crowded), or one that leased and went
// cold, for which only seen is written. What a leased key needs (its
// tokens, expiries, pace and refill state) is its held, allocated when
// its first refill is queued and never replaced.
type entry struct {
	subject string
	lim     atomic.Pointer[Limit]
	held    atomic.Pointer[held] // nil until the first refill is queued
	// seen is the start (clock ns, low 8 bits cleared) of the key's
	// current window of Takes sent to the exact path because it was cold
	// (Options.ColdExact) by the key table rather than the cold filter,
	// and in the low 8 bits their count (Manager.cold); 0 if none.
	seen  atomic.Int64
	flags atomic.Uint32
	// hash is the low half of the key's hash: the table's probe filter
	// and slot (a stripe's table never reaches 2^32 slots).
	hash uint32
}

// held is what a leased key needs: 64 bytes.
//
// Tokens on hand live in two lease generations packed in gens, so that
// a refill never extends the life of tokens from an earlier grant: cur
// holds the newest grant (void from curExp on), old holds what was left
// of earlier grants (void from oldExp on, oldExp <= curExp). One CAS on
// gens takes from both at once.
type held struct {
	gens   atomic.Uint64 // old<<32 | cur, each an int32 token count
	curExp atomic.Int64  // clock ns; 0 = never leased
	oldExp atomic.Int64
	// denyTil is the clock ns until which the key is denied from memory
	// once its tokens on hand are spent, and no refill is sent: the region
	// bucket was empty or too low for a useful grant (see Pace). 0 after an
	// answer that left a useful grant in the bucket.
	denyTil atomic.Int64
	demand  *demand      // nil unless the limit is global-scope
	wm      atomic.Int32 // refill when on hand <= wm
	left    atomic.Int32 // region bucket tokens after the last grant (for Remaining), capped
	// Written only by the refill of this entry (one at a time) and read by
	// the next one: the recent-rate estimate, what was on hand just after
	// the last grant, the bucket's effective rate (tokens/s) from the last
	// answer, and answered (see setAnswered).
	rate     float32
	lastHand int32
	bucket   float32
	answered uint32
}

// setAnswered records when an answer arrived (clock ns) and whether it
// found the node alone on the bucket (see Alone), in 4 bytes so that held
// stays 64: milliseconds, rounded up, in the high 31 bits (a gap past 12 days
// reads as none: such a key may take one lone pace), alone in the low
// bit. A held whose bucket is 0 was never answered.
func (e *held) setAnswered(now int64, alone bool) {
	e.answered = uint32((now+999_999)/1_000_000) << 1
	if alone {
		e.answered |= 1
	}
}

// sinceAnswered is the time from the last answer's arrival to t (clock
// ns), never more than the truth, and whether that answer found the node
// alone.
func (e *held) sinceAnswered(t int64) (gap time.Duration, alone bool) {
	ms := int32((uint32(t/1_000_000)<<1 - e.answered&^1)) >> 1 // sign-extends 31 bits
	return time.Duration(max(ms, 0)) * time.Millisecond, e.answered&1 != 0
}

// holdLocked returns e's held, making it and counting it in the cold
// filter f (if any). The caller holds the stripe lock (so two are never
// made).
func (e *entry) holdLocked(lim *Limit, f *coldFilter) *held {
	if h := e.held.Load(); h != nil {
		return h
	}
	h := &held{}
	if lim.global {
		h.demand = &demand{}
	}
	e.held.Store(h)
	if f != nil {
		f.hold(e.hash)
	}
	return h
}

// flags bits.
const (
	flagPending  = 1 << iota // queued for the next refill of its stripe
	flagFlushing             // in a refill call now
	flagDead                 // evicted: look the key up again
)

// demand counts tokens admitted and denied since the last DrainDemand.
type demand struct {
	admitted atomic.Int64
	denied   atomic.Int64
}

func pack(old, cur int64) uint64 { return uint64(uint32(int32(old)))<<32 | uint64(uint32(int32(cur))) }

func unpack(v uint64) (old, cur int64) { return int64(int32(uint32(v >> 32))), int64(int32(uint32(v))) }

// ticket records a take so it can be given back exactly.
type ticket struct {
	n   int64
	exp int64 // the earliest expiry among the generations taken from
}

// live returns the tokens of each generation that may still be spent at
// now. Expiries are loaded before gens: a refill swaps gens before it
// moves the expiries forward, so a stale expiry only ever voids tokens
// early, never late.
func (e *held) live(now int64) (v uint64, old, cur int64) {
	oe, ce := e.oldExp.Load(), e.curExp.Load()
	v = e.gens.Load()
	o, c := unpack(v)
	if now < oe && o > 0 {
		old = o
	}
	if now < ce && c > 0 {
		cur = c
	}
	return v, old, cur
}

// take takes cost tokens, oldest generation first. It returns the tokens
// still on hand after the take.
func (e *held) take(now, cost int64) (t ticket, rest int64, ok bool) {
	return e.takeRange(now, cost, cost)
}

// takeRange takes what is on hand up to most tokens, oldest generation
// first, if that is at least least. It returns the tokens still on hand
// after the take (or found, if fewer than least).
func (e *held) takeRange(now, least, most int64) (t ticket, rest int64, ok bool) {
	for {
		oe, ce := e.oldExp.Load(), e.curExp.Load()
		v := e.gens.Load()
		o, c := unpack(v)
		var old, cur int64
		if now < oe && o > 0 {
			old = o
		}
		if now < ce && c > 0 {
			cur = c
		}
		if old+cur < least {
			return ticket{}, old + cur, false
		}
		cost := min(most, old+cur)
		fromOld := min(old, cost)
		exp := ce
		if fromOld > 0 {
			exp = oe
		}
		if e.gens.CompareAndSwap(v, pack(o-fromOld, c-(cost-fromOld))) {
			return ticket{n: cost, exp: exp}, old + cur - cost, true
		}
	}
}

// give puts back the tokens of a take, into a generation that dies no
// later than they would have. If none is live they are dropped: giving
// them a longer life could break the overshoot bound.
func (e *held) give(now int64, t ticket) bool {
	for {
		oe, ce := e.oldExp.Load(), e.curExp.Load()
		v := e.gens.Load()
		o, c := unpack(v)
		var nv uint64
		switch {
		case now < oe && oe <= t.exp && o >= 0:
			nv = pack(o+t.n, c)
		case now < ce && ce <= t.exp && c >= 0:
			nv = pack(o, c+t.n)
		default:
			return false
		}
		if e.gens.CompareAndSwap(v, nv) {
			return true
		}
	}
}

// install adds a new grant as the cur generation, moving what is left of
// cur into old. Called only by the entry's refill. exp must be >= curExp.
func (e *held) install(now, exp, granted int64) (onHand int64) {
	for {
		v, old, cur := e.live(now)
		oe, ce := e.oldExp.Load(), e.curExp.Load()
		nOld, nOldExp := cur, ce
		if old > 0 {
			// Both keep the earlier expiry: never extends a token's life.
			nOld, nOldExp = old+cur, oe
		}
		if e.gens.CompareAndSwap(v, pack(nOld, granted)) {
			// gens first, then expiries (see live).
			e.oldExp.Store(nOldExp)
			e.curExp.Store(max(exp, ce))
			return nOld + granted
		}
	}
}

// drain takes every live token (for a return) and reports how many came
// from each generation.
func (e *held) drain(now int64) (old, cur int64) {
	for {
		v, o, c := e.live(now)
		if o == 0 && c == 0 {
			return 0, 0
		}
		if e.gens.CompareAndSwap(v, 0) {
			return o, c
		}
	}
}
