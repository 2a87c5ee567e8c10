package lease

import (
	"context"
	"errors"
)

// TakeUpTo takes between 1 and most tokens for the key of lim and
// subject, for a caller that spends a batch of them elsewhere (an RLQS
// client's assignment, internal/rlqs). It takes what is on hand, up to
// most; with none on hand it waits for the refill it joins, as a Take of
// cost 1 does, and then takes what that brought. The lease's pacing and
// deny cache apply as to Take: a denied Result took nothing. It never
// answers Result.Exact: a caller taking batches is warm by construction.
//
// The tokens may be spent only until the batch's own expiry, which the
// caller bounds: the overshoot bound then grows by that time
// (ARCHITECTURE.md, "RLQS: assignments from leases").
func (m *Manager) TakeUpTo(ctx context.Context, lim *Limit, subject []byte, most int64) (Result, error) {
	var r Result
	if most <= 0 {
		return r, errors.New("lease: TakeUpTo of no tokens")
	}
	h := m.hash(subject) ^ lim.mix
	sh := &m.stripes[h>>(64-stripeBits)]
	e := sh.table.Load().find(h, lim, subject)
	if m.takeOnHand(sh, e, lim, most, &r) {
		return r, nil
	}
	if err := m.takeSlow(ctx, lim, subject, 1, most, h, sh, e, true, &r); err != nil || !r.Allowed || most == 1 {
		return r, err
	}
	// The refill brought what it brought: take more of it, under one
	// ticket that dies with the earlier of the two.
	first := r
	if e = sh.table.Load().find(h, lim, subject); e != nil && m.takeOnHand(sh, e, lim, most-1, &r) {
		r.t.n += first.t.n
		r.t.exp = min(r.t.exp, first.t.exp)
		return r, nil
	}
	return first, nil
}

// takeOnHand takes between 1 and most tokens on hand from e (nil: none)
// into r, as TakeTo's straight path does, and reports whether it did.
func (m *Manager) takeOnHand(sh *stripe, e *entry, lim *Limit, most int64, r *Result) bool {
	if e == nil {
		return false
	}
	hd := e.held.Load()
	if hd == nil {
		return false
	}
	now := m.clock.Now()
	t, rest, ok := hd.takeRange(now, 1, most)
	if !ok {
		return false
	}
	m.allowed(sh, e, hd, lim, now, t.n, rest, t, r)
	return true
}

// Tokens is how many tokens the Take took (its cost; for TakeUpTo, what
// it got), less what GiveBackPart returned.
func (r *Result) Tokens() int64 {
	if !r.Allowed {
		return 0
	}
	return r.t.n
}
