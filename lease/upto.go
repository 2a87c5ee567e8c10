package lease

import (
	"context"
	"errors"
)

// TakeUpTo takes between 1 and most tokens for the key of lim and
// subject, for a caller that spends a batch of them elsewhere (an RLQS
// client's assignment, internal/rlqs). It takes what is on hand, up to
// most; when that is short it joins a refill sized for want (at least
// the rest; see size), and takes what that brought too, up to most. A
// want above most leaves the difference on hand, in this node's lease,
// for the other batch takers of the key (the other clients of a bucket
// on this node): taken from the region bucket now rather than left there
// to overflow its burst. A pace set before it does not
// stop that refill (see takeSlow); a denial by its own refill does, and
// a Result that took nothing is not Allowed. It never answers
// Result.Exact: a caller taking batches is warm by construction.
//
// The tokens may be spent only until the batch's own expiry, which the
// caller bounds: the overshoot bound then grows by that time
// (ARCHITECTURE.md, "RLQS: assignments from leases").
func (m *Manager) TakeUpTo(ctx context.Context, lim *Limit, subject []byte, most, want int64) (Result, error) {
	var r Result
	if most <= 0 {
		return r, errors.New("lease: TakeUpTo of no tokens")
	}
	h := m.hash(subject) ^ lim.mix
	sh := &m.stripes[h>>(64-stripeBits)]
	var got Result
	if m.takeOnHand(sh, sh.table.Load().find(h, lim, subject), lim, most, &got) && got.t.n == most {
		return got, nil
	}
	// Short: join a refill sized for the rest, and take what it brought.
	// What was on hand is kept whatever the refill answers.
	err := m.takeSlow(ctx, lim, subject, 1, max(want-got.t.n, most-got.t.n), h, sh, nil, true, &r)
	if err != nil || !r.Allowed {
		if got.Allowed {
			return got, nil
		}
		return r, err
	}
	r.merge(&got)
	var more Result
	if rest := most - r.t.n; rest > 0 && m.takeOnHand(sh, sh.table.Load().find(h, lim, subject), lim, rest, &more) {
		more.merge(&r)
		return more, nil
	}
	return r, nil
}

// merge adds the tokens of an allowed take o to r, under one ticket that
// dies with the earlier of the two.
func (r *Result) merge(o *Result) {
	if !o.Allowed {
		return
	}
	r.t.n += o.t.n
	r.t.exp = min(r.t.exp, o.t.exp)
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
