package algorithm

import "time"

// GCRAState is the generic cell rate algorithm's state: TAT, the
// theoretical arrival time of the next request (microseconds on the
// store's clock). A missing key has TAT = now.
//
// With the emission interval T = ⌈Period/Limit⌉ µs (rounded up to the
// store clock's microsecond, so all the maths is exact integer maths) and
// the burst tolerance τ = Burst·T, a take of cost c at time now computes
//
//	tat' = max(TAT, now) + c·T
//
// and admits iff tat' − now <= τ, storing TAT = tat'. So requests are
// spaced T apart on average and up to Burst may arrive at once: the same
// decisions as a token bucket of Burst tokens refilled every T, kept as
// one timestamp instead of a count and a time.
//
// The results are: remaining ⌊(τ − (TAT − now))/T⌋, retry tat' − τ − now
// when denied, reset TAT − now (the time until a full burst is available
// again).
//
// Refund moves TAT back by c·T (not before now). It is exact unless the
// key went idle in between, where a full bucket has nothing to give back.
type GCRAState struct {
	TAT   int64
	Valid bool
}

// interval is the emission interval T = ⌈Period/Limit⌉ in microseconds.
func (s Spec) interval() int64 { return max(ceilDiv(s.window(), s.Limit), 1) }

// tolerance is τ = Burst·T in microseconds.
func (s Spec) tolerance() int64 { return s.Capacity() * s.interval() }

// Decide answers a take of cost at now (see GCRAState for the formulas).
func (g GCRAState) Decide(s Spec, now, cost int64) Decision {
	T, tau := s.interval(), s.tolerance()
	tat := now
	if g.Valid && g.TAT > now {
		tat = g.TAT // a clock that steps back leaves TAT ahead: never mints
	}
	d := Decision{TTL: s.TTL()}
	var next int64
	if cost > s.Capacity() {
		// Also keeps cost·T from overflowing: τ fits 2^53 (Validate).
		d.Taken.RetryAfter, d.Kept.RetryAfter = Never, Never
	} else {
		next = tat + cost*T
		d.OK = next-now <= tau
		if !d.OK {
			d.Taken.RetryAfter = micros(next - tau - now)
			d.Kept.RetryAfter = d.Taken.RetryAfter
		}
	}
	d.Kept.Remaining, d.Kept.ResetAfter = gcraLeft(T, tau, tat-now)
	if d.OK {
		d.Taken.Remaining, d.Taken.ResetAfter = gcraLeft(T, tau, next-now)
		d.Next = State{Algorithm: GCRA, GCRA: GCRAState{TAT: next, Valid: true}}
	} else {
		d.Taken.Remaining, d.Taken.ResetAfter = d.Kept.Remaining, d.Kept.ResetAfter
	}
	return d
}

// gcraLeft is the remaining whole tokens and the time to full for a TAT
// that is ahead µs after now.
func gcraLeft(T, tau, ahead int64) (int64, time.Duration) {
	return max(tau-ahead, 0) / T, micros(ahead)
}

func (g GCRAState) refund(s Spec, now, cost int64) (State, time.Duration, bool) {
	if !g.Valid {
		return State{}, 0, false
	}
	// Capping cost at the burst changes nothing (TAT is never more than τ
	// ahead) and keeps c·T from overflowing.
	tat := max(g.TAT-min(cost, s.Capacity())*s.interval(), now)
	return State{Algorithm: GCRA, GCRA: GCRAState{TAT: tat, Valid: true}}, s.TTL(), true
}
