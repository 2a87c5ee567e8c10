package sim

import (
	"fmt"
	"slices"
	"time"
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

// overlap starts next in reg beside the coordinators there, active at
// once, and stops those after d: for d, two coordinators each believe
// they hold the region's lock (a lock lost without the old one noticing:
// a GC pause, a clock jump). Both drain the nodes' demand, report, hear
// the others, and write shares.
func (s *Sim) overlap(reg *region, next *coordinator, d time.Duration) {
	old := reg.coords
	next.started = true
	reg.coords = append(reg.coords, next)
	next.tick()
	s.q.push(s.now+int64(d), func() {
		for _, o := range old {
			o.stopped = true
		}
		reg.coords = slices.DeleteFunc(reg.coords, func(c *coordinator) bool { return c.stopped })
	})
}
