package sim

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/lease"
)

// Sim is one scenario in progress. It is not safe for concurrent use;
// Run owns it.
type Sim struct {
	cfg      Config
	q        queue
	now      int64 // ns since the start
	rng      *rand.Rand
	dist     *keyDist
	global   coord.Limit
	nodeSpec algorithm.Spec // a node's numbers when no share is written
	regions  []*region
	subjects [][]byte
	// expired is every Take's ctx: a Take with no tokens on hand returns
	// at once (it cannot block the only thread) and the request waits for
	// its refill as a node's would (node.waiters).
	expired  context.Context
	cur      *call
	workers  []*worker
	idle     []*worker
	met      *metrics
	rates    []float64
	stranded int64
	undone   int
}

// region is one region: its Redis, its nodes, its coordinator, the
// demand its nodes published since the coordinator's last drain.
type region struct {
	idx    int
	name   string
	store  *store
	nodes  []*node
	alive  []*node
	coord  *coordinator
	demand map[string]float64
}

// clock is the managers' lease.Clock: virtual time, never 0.
type clock struct{ s *Sim }

func (c clock) Now() int64 { return c.s.now + 1 }

// Run simulates c and returns what happened.
func Run(c Config) (*Result, error) {
	if c.Burst == 0 {
		c.Burst = c.Limit
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	s, err := build(c)
	if err != nil {
		return nil, err
	}
	end := int64(c.Duration)
	for s.q.len() > 0 && s.q.peek() < end {
		e := s.q.pop()
		s.now = e.at
		e.fn()
	}
	s.now = end
	s.stopWorkers()
	return s.result(), nil
}

func build(c Config) (*Sim, error) {
	spec := algorithm.Spec{Algorithm: algorithm.TokenBucket, Limit: c.Limit, Period: time.Second, Burst: c.Burst}
	expired, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	cancel()
	s := &Sim{
		cfg: c, rng: rand.New(rand.NewPCG(c.Seed, c.Seed^0x9e3779b97f4a7c15)), dist: newKeyDist(&c),
		global: coord.Limit{Rate: spec.Rate(), Burst: float64(spec.Capacity())}, expired: expired,
	}
	s.met = newMetrics(&c, spec.Rate(), float64(spec.Capacity()))
	s.subjects = make([][]byte, c.Keys)
	for k := range s.subjects {
		s.subjects[k] = []byte(subject(k))
	}
	src := c.sources
	if src == nil {
		src = Sources()
	}
	em, err := newRedisEm(src)
	if err != nil {
		return nil, err
	}
	keep := time.Duration(0)
	for _, f := range c.Failovers {
		keep = max(keep, f.Loss)
	}
	s.nodeSpec = spec.Share(c.Regions)
	for r := range c.Regions {
		s.regions = append(s.regions, &region{
			idx: r, name: RegionName(r), store: newStore(em, c.Keys, len(c.Failovers) > 0, keep), demand: map[string]float64{},
		})
	}
	for _, reg := range s.regions {
		for i := range c.Nodes {
			nd := &node{s: s, reg: reg, idx: i, alive: true, exactDemand: map[int]float64{}}
			m, err := lease.New(lease.Options{
				Source: source{nd}, Clock: clock{s}, SweepEvery: -1, Executor: nd.execute, FixedHash: true, ColdExact: true, // as node runs it
				Defaults: lease.Config{TTL: cmp.Or(c.spendFor, c.TTL), TargetPeriod: c.TargetPeriod, ColdHits: c.ColdHits},
				Logger:   slog.New(slog.DiscardHandler),
			})
			if err != nil {
				return nil, fmt.Errorf("sim: node: %w", err)
			}
			nd.m = m
			if nd.lim, err = m.NewLimit(keyFn, s.nodeSpec, lease.Config{}, true); err != nil {
				return nil, fmt.Errorf("sim: limit: %w", err)
			}
			reg.nodes = append(reg.nodes, nd)
			reg.alive = append(reg.alive, nd)
			// Nodes publish demand and sweep at their own phases.
			phase := int64(c.DemandPeriod) * int64(i) / int64(c.Nodes)
			s.every(phase, int64(c.DemandPeriod), nd.publish)
			s.every(int64(5*time.Second)*int64(i)/int64(c.Nodes), int64(5*time.Second), func() {
				if nd.alive {
					nd.m.Sweep()
				}
			})
		}
		co, err := newCoordinator(s, reg)
		if err != nil {
			return nil, fmt.Errorf("sim: coordinator: %w", err)
		}
		reg.coord = co
		s.q.push(0, co.tick)
	}
	s.every(0, int64(c.Arrival), s.arrive)
	for _, f := range c.Crashes {
		nd := s.regions[f.Region].nodes[f.Node]
		s.q.push(int64(f.At), func() { s.crash(nd) })
	}
	for _, f := range c.Failovers {
		st := s.regions[f.Region].store
		s.q.push(int64(f.At), func() {
			// A lost shrink can leave shares summing past L (Theorem 1
			// assumes writes that were acknowledged stay written).
			for _, k := range st.failover(s.now/1000, f.Loss.Microseconds()) {
				s.undone++
				s.met.shareSum(s, k)
			}
		})
	}
	for _, f := range c.CoordFailovers {
		reg := s.regions[f.Region]
		next, err := newCoordinator(s, reg)
		if err != nil {
			return nil, fmt.Errorf("sim: coordinator: %w", err)
		}
		s.q.push(int64(f.At), func() { s.coordFailover(reg, next, f.After) })
	}
	return s, nil
}

// every runs fn at first and then every period until the end.
func (s *Sim) every(first, period int64, fn func()) {
	end := int64(s.cfg.Duration)
	var tick func()
	tick = func() {
		fn()
		if next := s.now + period; next < end {
			s.q.push(next, tick)
		}
	}
	s.q.push(first, tick)
}

// arrive generates one arrival tick's requests in every region, each for
// a key of the distribution on a node of the region. Arrivals are Poisson,
// as independent clients make them: a region's count in a short window
// is noisy, and the coordinators measure demand over short windows.
func (s *Sim) arrive() {
	dt := s.cfg.Arrival.Seconds()
	s.rates = s.cfg.rates(time.Duration(s.now), s.rates)
	for r, reg := range s.regions {
		n := poisson(s.rng, s.rates[r]*dt)
		for range n {
			k := s.dist.pick(s.rng)
			s.met.arrived(r, k, s.now)
			if len(reg.alive) == 0 {
				s.met.decided(r, k, s.now, refused)
				continue
			}
			nd := reg.alive[0]
			if !s.cfg.HotNode && len(reg.alive) > 1 {
				nd = reg.alive[s.rng.IntN(len(reg.alive))]
			}
			nd.take(k, 0)
		}
	}
}

// publish sends the node's demand since its last publish to its
// coordinator (NATS within the region: half a Redis round trip).
func (nd *node) publish() {
	if !nd.alive {
		return
	}
	d := make(map[string]float64, len(nd.exactDemand))
	for k, n := range nd.exactDemand { // the exact path's, as decide's DrainDemand
		d[keyFn(string(nd.s.subjects[k]))] = n
	}
	clear(nd.exactDemand)
	nd.m.DrainDemand(func(key string, admitted, denied int64) {
		d[key] += float64(max(0, admitted) + max(0, denied))
	})
	if len(d) == 0 {
		return
	}
	reg := nd.reg
	nd.s.q.push(nd.s.now+int64(nd.s.cfg.RedisRTT/2), func() {
		for k, v := range d {
			reg.demand[k] += v
		}
	})
}

func (s *Sim) crash(nd *node) {
	if !nd.alive {
		return
	}
	s.stranded += nd.crash()
	reg := nd.reg
	for i, x := range reg.alive {
		if x == nd {
			reg.alive = append(reg.alive[:i], reg.alive[i+1:]...)
			break
		}
	}
}

// poisson draws from the Poisson distribution of mean mean: Knuth's
// product of uniforms, in parts of mean at most 16 (a sum of Poisson
// draws is Poisson), so exp(-mean) never underflows; O(mean) draws.
func poisson(rng *rand.Rand, mean float64) int {
	n := 0
	for mean > 0 {
		part := min(mean, 16)
		mean -= part
		limit, p := math.Exp(-part), rng.Float64()
		for p > limit {
			n++
			p *= rng.Float64()
		}
	}
	return n
}
