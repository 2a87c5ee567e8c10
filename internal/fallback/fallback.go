// Package fallback is the local store a node decides `on_store_failure:
// local` policies from while the region's Redis is unavailable: every
// limit is cut to limit / N, where N is the number of live nodes in the
// region, so that the region as a whole still admits about the limit. A
// share too small for one request is raised to hold one (see "A share of
// at least one request" below).
//
// It owns the in-process counters of the fallback and the scaling by N;
// it must not decide when to fall back (package decide does) nor count N
// (package membership does), and it never writes to Redis: when Redis is
// back, counting continues from Redis's state, and what the fallback
// admitted is forgotten.
//
// # Scaling by N, and rescaling without losing counts
//
// A bucket of rate r/N and capacity b/N taking cost c behaves exactly as a
// bucket of rate r and capacity b taking cost c·N (divide every amount by
// N). The store keeps the latter: the policy's own Spec (raised only where
// a share would hold less than one request), in memstore, with every cost
// multiplied by the N of the moment. State is therefore kept as a fraction
// of the node's share, and a change of N rescales every key at once,
// keeping what it counted: a key that used a third of its share still has
// used a third of its (new) share. That is the fair choice in both
// directions:
//
//   - N falls (a node died): shares grow to limit / N', and a key keeps the
//     fraction it used, so a survivor that spent its whole share in this
//     window does not get a fresh allowance for the rest of the window.
//   - N grows (a node joined): shares shrink, and a key keeps its fraction;
//     no key gets tokens from a rescale.
//
// The alternative, keeping absolute counts, would on a fall give a
// survivor that used all of limit/3 another limit/2 - limit/3 at once in
// the same window. docs/algorithms.md ("Local fallback: the region's
// total") derives the region's bound from this choice: admitted(W) <=
// b + r·T + (k / N)·b over any window W of length T in which k of N
// nodes crashed.
//
// Remaining and limits reported to callers are in requests: the units
// divided by N, rounded down. Limits are not rounded to whole requests: a
// limit of 5 over N = 3 nodes admits 5/3 per period per node on average,
// not 1.
//
// # A share of at least one request
//
// A capacity (the burst, or a window's limit) below cost·N would leave
// each node a share smaller than one request of that cost, and every
// such request would be denied on every node for as long as Redis is
// down. So the capacity is raised to cost·N (atLeastOne): each node's
// share holds one request of that cost, and the region may admit up to N
// of them per period, more than the limit (ARCHITECTURE.md, "Failure
// modes": "Local fallback: `limit / N`"). A cost above the capacity
// itself is still never admitted.
package fallback

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/memstore"
)

// Sizer reports N, the number of nodes to divide limits by.
// *membership.Members is one; it never reports less than its floor.
type Sizer interface {
	N() int
}

// Fixed is a Sizer with a constant N, for nodes without gossip (N is then
// the configured floor).
type Fixed int

// N returns f.
func (f Fixed) N() int { return int(f) }

// Store is the fallback store. It is safe for concurrent use.
type Store struct {
	mem  *memstore.Store
	size Sizer
}

// New returns a fallback store dividing limits by size.N() at each call.
// now is its clock; nil means the wall clock.
func New(size Sizer, now func() time.Time) *Store {
	return &Store{mem: memstore.New(now), size: size}
}

// N is the divisor in force: size.N(), at least 1.
func (s *Store) N() int64 { return max(int64(s.size.N()), 1) }

// Share is capacity / N, rounded down: one node's part of the limit, as
// reported to callers. (Take enforces at least one request of the cost
// taken: atLeastOne.)
func (s *Store) Share(capacity int64) int64 { return capacity / s.N() }

// Take takes every group all-or-nothing from this node's share of each
// limit. Results are in requests: Remaining is the whole requests left of
// this node's share; RetryAfter and ResetAfter are the share's own.
func (s *Store) Take(ctx context.Context, groups []algorithm.Group) ([]algorithm.Result, error) {
	n := s.N()
	res, err := s.mem.Take(ctx, scaled(groups, n))
	if err != nil {
		return nil, fmt.Errorf("fallback: %w", err)
	}
	for i := range res {
		for j := range res[i].Items {
			res[i].Items[j].Remaining /= n
		}
	}
	return res, nil
}

// Refund gives back what a Take of the same groups took. If N changed in
// between, the refund is scaled by the new N (capped at the capacity):
// a few units more or less for one request, never a lasting drift.
func (s *Store) Refund(ctx context.Context, groups []algorithm.Group) error {
	if err := s.mem.Refund(ctx, scaled(groups, s.N())); err != nil {
		return fmt.Errorf("fallback: %w", err)
	}
	return nil
}

// Len is the number of keys held (for tests and metrics).
func (s *Store) Len() int { return s.mem.Len() }

// scaled copies groups with every cost multiplied by n, and every share
// raised to hold at least one request (see atLeastOne).
func scaled(groups []algorithm.Group, n int64) []algorithm.Group {
	out := make([]algorithm.Group, len(groups))
	for i, g := range groups {
		out[i] = make(algorithm.Group, len(g))
		for j, it := range g {
			it.Spec = atLeastOne(it.Spec, it.Cost, n)
			it.Cost *= n
			out[i][j] = it
		}
	}
	return out
}

// atLeastOne raises the capacity of s so that one node's share, capacity
// / n, holds a request of cost. Without it a limit below n per period
// (say 5 logins a minute on 10 nodes) would deny every request on every
// node for as long as the store is down. The price is a bounded overshoot:
// the region may admit n requests of that cost per period instead of the
// limit (ARCHITECTURE.md ("Failure modes")). A cost above the limit itself stays
// impossible.
func atLeastOne(s algorithm.Spec, cost, n int64) algorithm.Spec {
	need := cost * n
	if cost <= 0 || cost > s.Capacity() || need <= s.Capacity() {
		return s
	}
	if s.Algorithm.Windowed() {
		// No burst: capacity is the limit; Burst is 0 or equal to it.
		s.Limit = need
		if s.Burst != 0 {
			s.Burst = need
		}
		return s
	}
	s.Burst = need
	return s
}
