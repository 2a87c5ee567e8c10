package sim

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/coord/demand"
	"github.com/allot-dev/allot/internal/fallback"
	"github.com/allot-dev/allot/lease"
)

// Sim is one scenario in progress. It is not safe for concurrent use;
// Run owns it.
type Sim struct {
	cfg Config
	q   queue
	now int64 // ns since the start
	rng *rand.Rand
	// frng draws the faults' randomness (faults.go): a fault turned on
	// leaves the arrivals as they were.
	frng     *rand.Rand
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
	restarts int
}

// region is one region: its Redis, its nodes, its coordinators.
type region struct {
	idx   int
	name  string
	store *store
	nodes []*node
	alive []*node
	// coords are the coordinators subscribed to the region's messages
	// (one, or two while an Overlap lasts or a standby waits to take
	// over); all is every coordinator the region ever had.
	coords []*coordinator
	all    []*coordinator
	// coordOff is the region's coordinators' clock offset (Skew.Coord).
	coordOff time.Duration
}

// clock is a manager's lease.Clock: virtual time plus the node's offset,
// never 0.
type clock struct {
	s   *Sim
	off int64
}

func (c clock) Now() int64 { return c.s.now + 1 + c.off }

// offset draws a clock offset in [-max, max] (0 without a draw if max
// is 0).
func (s *Sim) offset(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return time.Duration(s.frng.Int64N(2*int64(max)+1)) - max
}

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
		frng:   rand.New(rand.NewPCG(c.Seed^0x5851f42d4c957f2d, c.Seed+0x14057b7ef767814f)),
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
		st := newStore(em, c.Keys, len(c.Failovers) > 0, keep)
		// Only differences of a Redis's TIME matter to its own buckets;
		// the offset is kept positive for the expiry arithmetic.
		st.skewUs = (s.offset(c.Skew.Redis) + c.Skew.Redis).Microseconds()
		s.regions = append(s.regions, &region{idx: r, name: RegionName(r), store: st, coordOff: s.offset(c.Skew.Coord)})
	}
	for _, reg := range s.regions {
		for i := range c.Nodes {
			if err := s.addNode(reg, i); err != nil {
				return nil, err
			}
		}
		co, err := newCoordinator(s, reg)
		if err != nil {
			return nil, fmt.Errorf("sim: coordinator: %w", err)
		}
		s.q.push(0, co.start)
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
	if err := s.scheduleFaults(); err != nil {
		return nil, err
	}
	return s, nil
}

// addNode starts node i of reg: a real lease manager, publishing its
// demand and sweeping at its own phases.
func (s *Sim) addNode(reg *region, i int) error {
	c := &s.cfg
	nd := &node{s: s, reg: reg, idx: i, alive: true, exactDemand: map[int][2]int64{}}
	nd.clockOff = int64(s.offset(c.Skew.Node) + c.Skew.Node) // a lease.Clock is positive
	if err := nd.start(); err != nil {
		return err
	}
	reg.nodes = append(reg.nodes, nd)
	reg.alive = append(reg.alive, nd)
	phase := int(i % c.Nodes)
	// Snapshots at the middles of the period's N parts, none on a whole
	// second: a node publishing exactly on the epochs' grid would have
	// its snapshot counted in the epoch's demand window or the next one's
	// by the driver's last round trip (a lock renewal due just before an
	// epoch delays the epoch's drain by its round trip), where a real
	// node's phase is anywhere.
	s.every(s.now+int64(c.DemandPeriod)*int64(2*phase+1)/int64(2*c.Nodes), int64(c.DemandPeriod), nd.publish)
	s.every(s.now+int64(5*time.Second)*int64(phase)/int64(c.Nodes), int64(5*time.Second), func() {
		if nd.alive {
			nd.m.Sweep()
		}
	})
	return nil
}

// start gives the node a new lease manager (and local fallback store), as
// a process starting does.
func (nd *node) start() error {
	s, c := nd.s, &nd.s.cfg
	m, err := lease.New(lease.Options{
		Source: source{nd}, Clock: clock{s, nd.clockOff}, SweepEvery: -1, Executor: nd.execute, FixedHash: true, ColdExact: true, // as node runs it
		Defaults: lease.Config{TTL: cmp.Or(c.spendFor, c.TTL), TargetPeriod: c.TargetPeriod, ColdHits: c.ColdHits},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return fmt.Errorf("sim: node: %w", err)
	}
	nd.m = m
	nd.grants = map[int][]grant{} // a new process holds none
	if nd.lim, err = m.NewLimit(keyFn, s.nodeSpec, lease.Config{}, true); err != nil {
		return fmt.Errorf("sim: limit: %w", err)
	}
	nd.fb = nil
	if c.OnStoreFailure == FailLocal {
		nd.fb = fallback.New(regionSize{nd.reg}, nd.wall)
	}
	return nil
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
			if len(reg.alive) == 0 {
				s.met.arrived(r, k, s.now)
				s.met.decided(r, k, s.now, refused)
				continue
			}
			i := 0
			if !s.cfg.HotNode && len(reg.alive) > 1 {
				i = s.rng.IntN(len(reg.alive))
			}
			nd := s.inRotation(reg, i)
			if nd == nil {
				continue // every node away: the clients hold the request back
			}
			s.met.arrived(r, k, s.now)
			nd.take(k, 0)
		}
	}
}

// inRotation is the node that serves a request drawn for reg.alive[i]:
// that one, or while it is away (Config.Away) the next alive one that is
// not; nil if every one is away.
func (s *Sim) inRotation(reg *region, i int) *node {
	a := &s.cfg.Away
	if a.For <= 0 {
		return reg.alive[i]
	}
	t := time.Duration(s.now)
	for j := range reg.alive {
		nd := reg.alive[(i+j)%len(reg.alive)]
		if !a.away(nd.idx, s.cfg.Nodes, t) {
			return nd
		}
	}
	return nil
}

// publish sends the node's demand since its last publish to its
// coordinators as demand.Publisher does (demand.Snapshots of the
// leases' and the exact path's demand), on the region's NATS: half a
// Redis round trip, with the node links' jitter and the transports'
// loss. Each coordinator subscribed when a snapshot arrives adds it to
// its demand.Sum, as demand.Collector does.
func (nd *node) publish() {
	if !nd.alive {
		return
	}
	s, reg := nd.s, nd.reg
	snaps, err := demand.Snapshots(reg.name+"-"+strconv.Itoa(nd.idx), nd.drainDemand, natsMaxPayload)
	if err != nil {
		panic(fmt.Sprintf("sim: a demand snapshot: %v", err)) // built by demand.Encode
	}
	for _, b := range snaps {
		s.transmit(s.cfg.RedisRTT/2, s.cfg.Jitter.Node, func() {
			for _, co := range reg.coords {
				if err := co.demand.Add(b); err != nil {
					panic(fmt.Sprintf("sim: a demand snapshot does not decode: %v", err))
				}
			}
		})
	}
}

// natsMaxPayload is NATS's default max payload.
const natsMaxPayload = 1 << 20

// drainDemand is what allot-node publishes (internal/node/multiregion.go):
// the lease manager's DrainDemand, then the exact path's demand (decide's
// DrainDemand), here by key, in key order.
func (nd *node) drainDemand(fn func(key string, admitted, denied int64)) {
	nd.m.DrainDemand(fn)
	for _, k := range slices.Sorted(maps.Keys(nd.exactDemand)) {
		v := nd.exactDemand[k]
		fn(keyFn(string(nd.s.subjects[k])), v[0], v[1])
	}
	clear(nd.exactDemand)
}

func (s *Sim) crash(nd *node) {
	if !nd.alive {
		return
	}
	s.stranded += nd.crash()
	nd.gen++ // what was under way for the process that died is dropped
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
