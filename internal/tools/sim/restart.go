package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/allot-dev/allot/internal/coord"
)

// scheduleFaults puts the faults of faults.go that happen at a time on
// the event queue: restarts, joins, coordinator overlaps. (Jitter, loss,
// skew and outages act where the messages and calls they touch are
// made.)
func (s *Sim) scheduleFaults() error {
	c := &s.cfg
	for _, r := range c.Restarts {
		nd := s.regions[r.Region].nodes[r.Node]
		s.q.push(int64(r.At), func() { s.crash(nd) })
		s.q.push(int64(r.Back), func() { s.restart(nd) })
	}
	for _, j := range c.Joins {
		reg := s.regions[j.Region]
		s.q.push(int64(j.At), func() {
			if err := s.addNode(reg, len(reg.nodes)); err != nil {
				panic(fmt.Sprintf("sim: a joining node: %v", err)) // the same options built the first ones
			}
		})
	}
	for _, o := range c.Overlaps {
		reg := s.regions[o.Region]
		next, err := newCoordinator(s, reg)
		if err != nil {
			return fmt.Errorf("sim: coordinator: %w", err)
		}
		s.q.push(int64(o.From), func() { s.overlap(reg, next, o.To-o.From) })
	}
	return nil
}

// restart starts a crashed node again: a new process, with an empty lease
// manager, taking its part of the region's traffic from now on.
func (s *Sim) restart(nd *node) {
	if nd.alive {
		return
	}
	if err := nd.start(); err != nil {
		panic(fmt.Sprintf("sim: a restarting node: %v", err)) // the same options started it before
	}
	clear(nd.exactDemand)
	nd.waiters = nil
	nd.alive = true
	nd.reg.alive = append(nd.reg.alive, nd)
	s.restarts++
}

// overlap starts next in reg beside the coordinators there and makes
// those lose the lock without noticing until d later (a holder stalled
// past its lock's TTL, a clock jump): the lock's key is gone from the
// region's Redis now, and until then their renewals answer that they
// hold it whatever the key holds (a call fails while Redis is down, as
// any). next takes the free lock
// with lock_hold.lua at its first Hold and becomes active; for the rest
// of d two coordinators act at once: both drain the nodes' demand,
// report, hear the others and write shares. After d the old ones' next
// Hold finds next holding the lock and they stand by.
func (s *Sim) overlap(reg *region, next *coordinator, d time.Duration) {
	old := slices.Clone(reg.coords)
	for _, o := range old {
		o.blind = true
	}
	*reg.store.str(coord.LockKey(reg.name)) = strVal{}
	next.start()
	s.q.push(s.now+int64(d), func() {
		for _, o := range old {
			o.blind = false
		}
	})
}
