package rlqs

import (
	"math"
	"slices"
	"sync"
)

// subscribers are the streams of this node that hold one bucket id: a
// bucket's rate is split among them max-min fair by their demand, so
// that two clients offered more than the limit each get half, and a
// client offered less than its part gets what it asks.
type subscribers struct {
	mu sync.Mutex
	by map[string]map[*bucket]float64 // bucket id -> subscriber -> what it asks for (requests/s; +Inf unknown)
}

func newSubscribers() *subscribers { return &subscribers{by: map[string]map[*bucket]float64{}} }

// set records what b asks for under id.
func (s *subscribers) set(id string, b *bucket, demand float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.by[id]
	if m == nil {
		m = map[*bucket]float64{}
		s.by[id] = m
	}
	m[b] = demand
}

// drop forgets b.
func (s *subscribers) drop(id string, b *bucket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.by[id]; m != nil {
		delete(m, b)
		if len(m) == 0 {
			delete(s.by, id)
		}
	}
}

// part is b's max-min fair part of rate among id's subscribers, and what
// they ask for together, at most rate.
func (s *subscribers) part(id string, b *bucket, rate float64) (mine, all float64) {
	s.mu.Lock()
	m := s.by[id]
	ds := make([]float64, 0, len(m))
	ask, sum := math.Inf(1), 0.0
	for o, d := range m {
		ds = append(ds, d)
		sum += d
		if o == b {
			ask = d
		}
	}
	s.mu.Unlock()
	return maxMin(rate, ask, ds), min(rate, sum)
}

// count is how many subscribers id has (at least 1).
func (s *subscribers) count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(len(s.by[id]), 1)
}

// maxMin is the max-min fair part of rate of a demand mine among demands
// (which include mine): demands below the level are served in full, the
// rest split what is left evenly.
func maxMin(rate, mine float64, demands []float64) float64 {
	if len(demands) == 0 {
		return min(rate, mine)
	}
	slices.Sort(demands)
	left := rate
	for i, d := range demands {
		level := left / float64(len(demands)-i)
		if d >= level {
			return min(mine, level)
		}
		left -= d
	}
	return mine
}
