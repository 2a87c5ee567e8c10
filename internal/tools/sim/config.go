// Package sim is a deterministic discrete-event simulation of a whole
// Allot fleet on virtual time (issue 35): regions of nodes, each node a
// real lease.Manager deciding every request, each region a real
// coord.Coordinator (the production driver and its coord.Machine)
// sharing the global limits through rebalance. Only the I/O is
// modelled: a region's Redis (the project's scripts, store.go and
// redis.go), NATS between regions and from nodes to their coordinator,
// and their latencies (coord.go). One event queue on virtual time
// decides what runs next; no goroutine scheduling, wall clock or random
// seed does (the managers run their refills on the queue and hash with a
// fixed function: lease.Options.Executor and Hash, node.go), so the same
// Config gives the same Result, byte for byte.
package sim

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/coord"
)

// Config is one scenario.
type Config struct {
	Seed     uint64
	Duration time.Duration

	Regions int
	Nodes   int // per region
	// HotNode sends each region's traffic to its node 0 only (the
	// sandbox's two-node runs); otherwise requests are spread evenly.
	HotNode bool

	Keys    int
	Dist    string  // "uniform", "zipf" or "hot"
	ZipfS   float64 // zipf exponent (any s > 0)
	HotFrac float64 // "hot": the part of requests for key 0, the rest uniform

	// Rate is the total offered requests/s over all regions, split by
	// Split (weights per region; nil: even). At ShiftAt (0: never) the
	// split moves to ShiftTo, linearly over Ramp (0: a step).
	Rate    float64
	Split   []float64
	ShiftAt time.Duration
	ShiftTo []float64
	Ramp    time.Duration
	// A flash crowd multiplies region FlashRegion's offered rate by
	// FlashX during [FlashAt, FlashAt+FlashFor) (FlashFor 0: none).
	FlashRegion       int
	FlashAt, FlashFor time.Duration
	FlashX            float64

	// Away takes each node out of its region's rotation in turn (load.go).
	Away Away

	// Limit and Burst are every key's global token bucket: Limit tokens
	// per second, Burst (0: Limit) capacity.
	Limit int64
	Burst int64

	TTL          time.Duration // lease TTL
	TargetPeriod time.Duration // lease target period
	ColdHits     int           // lease cold hits (0: lease.DefaultColdHits)
	Interval     time.Duration // rebalance interval
	Headroom     float64
	Gather       float64
	DemandPeriod time.Duration // how often nodes publish demand

	RedisRTT      time.Duration // node or coordinator <-> region Redis, round trip
	RegionLatency time.Duration // one way between regions (NATS gateways)
	Arrival       time.Duration // arrivals are generated on this tick

	// Phase is how far past an epoch boundary the run starts: the
	// coordinators' epochs start at Phase-shifted multiples of Interval, so
	// a shift at a whole number of intervals lands Interval-Phase before
	// an epoch (a real shift lands at any phase).
	Phase time.Duration

	Crashes    []Crash
	Partitions []Partition
	Failovers  []Failover
	// CoordFailovers crash a region's coordinator; a new one takes over.
	CoordFailovers []CoordFailover

	// The faults of faults.go.
	Jitter   Jitter
	Loss     Loss
	Skew     Skew
	Outages  []Outage
	Restarts []Restart
	Joins    []Join
	Overlaps []Overlap
	// OnStoreFailure is every key's policy's on_store_failure: FailOpen
	// (the policies' default), FailClosed or FailLocal.
	OnStoreFailure string

	// sources are the scripts' texts (nil: Sources()); tests change them
	// to run mutants.
	sources map[string]string
	// spendFor, if set, is the lease TTL the nodes run with while the
	// bound is checked with TTL: a mutant whose leases outlive the TTL.
	spendFor time.Duration
}

// Crash kills a node at At as a crash would (lease.Manager.Abort: its
// leases' tokens are stranded, its in-flight calls fail).
type Crash struct {
	Region, Node int
	At           time.Duration
}

// Partition cuts coordinator links during [From, To): every link of
// Region, or with Link only the one between Region and Peer; in both
// directions, or with Dir only the messages leaving Region (Out) or
// arriving there (In).
type Partition struct {
	Region   int
	Peer     int
	Link     bool
	Dir      Direction
	From, To time.Duration
}

// Direction is which way a partition cuts a link.
type Direction uint8

// Directions of a Partition, seen from its Region.
const (
	Both Direction = iota
	Out
	In
)

// cuts reports whether p stops a message from region a to region b.
func (p *Partition) cuts(a, b int) bool {
	return p.Dir != In && a == p.Region && (!p.Link || b == p.Peer) ||
		p.Dir != Out && b == p.Region && (!p.Link || a == p.Peer)
}

// Failover replaces Region's Redis at At with a replica that lost the
// writes of the last Loss.
type Failover struct {
	Region int
	At     time.Duration
	Loss   time.Duration
}

// CoordFailover crashes Region's coordinators at At (the lock is not
// released, as by a killed process); a new one starts After later and
// becomes active once the crashed one's lock has expired (at most the
// lock's TTL, 5 s, after the crash).
type CoordFailover struct {
	Region int
	At     time.Duration
	After  time.Duration
}

// Default is the scenario the flags start from: production defaults.
func Default() Config {
	k := coord.DefaultKnobs()
	return Config{
		Seed: 1, Duration: time.Minute, Regions: 3, Nodes: 2, Keys: 1, Dist: "zipf", ZipfS: 1.1, HotFrac: 1,
		Rate: 3000, Limit: 300, TTL: 2 * time.Second, TargetPeriod: time.Second, Interval: k.Interval,
		Headroom: k.Headroom, Gather: k.Gather, DemandPeriod: time.Second, RedisRTT: time.Millisecond,
		RegionLatency: 40 * time.Millisecond, Arrival: time.Millisecond,
	}
}

// Validate reports what makes c unrunnable.
func (c *Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Duration > 0, "duration %v: want > 0", c.Duration)
	check(c.Regions >= 1 && c.Regions <= 64, "regions %d: want 1..64", c.Regions)
	check(c.Nodes >= 1 && c.Nodes <= 1024, "nodes %d: want 1..1024", c.Nodes)
	check(c.Keys >= 1 && c.Keys <= 10_000_000, "keys %d: want 1..10^7", c.Keys)
	check(c.Dist == "uniform" || c.Dist == "zipf" || c.Dist == "hot", "dist %q: want uniform, zipf or hot", c.Dist)
	check(c.Dist != "zipf" || c.ZipfS > 0, "zipf s %v: want > 0", c.ZipfS)
	check(c.HotFrac >= 0 && c.HotFrac <= 1, "hot fraction %v: want [0, 1]", c.HotFrac)
	check(c.Rate >= 0, "rate %v: want >= 0", c.Rate)
	check(c.Split == nil || len(c.Split) == c.Regions, "split has %d weights for %d regions", len(c.Split), c.Regions)
	check(c.ShiftTo == nil || len(c.ShiftTo) == c.Regions, "shift-to has %d weights for %d regions", len(c.ShiftTo), c.Regions)
	check(c.ShiftAt == 0 || c.ShiftTo != nil, "a shift time needs shift-to weights")
	check(c.Limit > 0 && c.Burst >= 0, "limit %d, burst %d: want limit > 0, burst >= 0", c.Limit, c.Burst)
	check(c.Arrival > 0 && c.Arrival <= time.Second, "arrival tick %v: want (0, 1s]", c.Arrival)
	check(c.DemandPeriod > 0, "demand period %v: want > 0", c.DemandPeriod)
	check(c.ColdHits >= 0, "cold hits %d: want >= 0", c.ColdHits)
	check(c.FlashFor == 0 || c.FlashRegion >= 0 && c.FlashRegion < c.Regions && c.FlashX >= 0, "flash crowd: bad region or factor")
	check(c.Phase >= 0, "phase %v: want >= 0", c.Phase)
	check(c.RedisRTT >= 0 && c.RegionLatency >= 0, "latencies must be >= 0")
	for _, w := range [][]float64{c.Split, c.ShiftTo} {
		sum := 0.0
		for _, x := range w {
			check(x >= 0, "weight %v: want >= 0", x)
			sum += x
		}
		check(w == nil || sum > 0, "weights %v sum to 0", w)
	}
	for _, f := range c.Crashes {
		check(f.Region >= 0 && f.Region < c.Regions && f.Node >= 0 && f.Node < c.Nodes, "crash of node %d/%d: no such node", f.Region, f.Node)
	}
	region := func(r int) bool { return r >= 0 && r < c.Regions }
	for _, p := range c.Partitions {
		check(region(p.Region) && (!p.Link || region(p.Peer) && p.Peer != p.Region) && p.From <= p.To, "partition %+v: bad region or times", p)
	}
	check(c.Jitter.Node >= 0 && c.Jitter.Coord >= 0 && c.Jitter.Region >= 0, "jitter %+v: want >= 0", c.Jitter)
	check(c.Skew.Redis >= 0 && c.Skew.Node >= 0 && c.Skew.Coord >= 0 && c.Skew.Redis < 24*time.Hour, "skew %+v: want >= 0, under a day", c.Skew)
	l := c.Loss
	check(l.Drop >= 0 && l.Drop < 1 && l.Dup >= 0 && l.Dup <= 1 && l.Reorder >= 0 && l.Reorder <= 1 && l.Hold >= 0,
		"loss %+v: want probabilities in [0, 1] (drop < 1), hold >= 0", l)
	check(c.Loss.Reorder == 0 || l.Hold > 0, "loss: reordering needs a hold > 0")
	check(c.OnStoreFailure == "" || c.OnStoreFailure == FailOpen || c.OnStoreFailure == FailClosed || c.OnStoreFailure == FailLocal,
		"on_store_failure %q: want open, closed or local", c.OnStoreFailure)
	for _, o := range c.Outages {
		check(region(o.Region) && o.From <= o.To, "redis outage %+v: bad region or times", o)
	}
	for _, r := range c.Restarts {
		check(region(r.Region) && r.Node >= 0 && r.Node < c.Nodes && r.At <= r.Back, "restart %+v: no such node, or back before down", r)
	}
	for _, j := range c.Joins {
		check(region(j.Region) && j.At >= 0, "join %+v: bad region or time", j)
	}
	for _, o := range c.Overlaps {
		check(region(o.Region) && o.From <= o.To, "coordinator overlap %+v: bad region or times", o)
	}
	a := c.Away
	check(a.For == 0 || a.For > 0 && a.Every >= a.For && a.From >= 0 && (a.To == 0 || a.To >= a.From),
		"away %+v: want for > 0, every >= for, from >= 0, to 0 or >= from", a)
	for _, f := range c.Failovers {
		check(f.Region >= 0 && f.Region < c.Regions && f.Loss >= 0, "failover %+v: bad region or loss", f)
	}
	for _, f := range c.CoordFailovers {
		check(f.Region >= 0 && f.Region < c.Regions && f.After >= 0, "coordinator failover %+v: bad region or delay", f)
	}
	return errors.Join(errs...)
}

// RegionName names region i: us, eu, ap, then r3, r4, ...
func RegionName(i int) string {
	if names := []string{"us", "eu", "ap"}; i < len(names) {
		return names[i]
	}
	return "r" + strconv.Itoa(i)
}

// ParseWeights reads "0.9,0.05,0.05"; "" is nil.
func ParseWeights(s string) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return nil, fmt.Errorf("weight %q: %w", f, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// ParseCrashes reads "region/node@t,...", e.g. "0/3@2m".
func ParseCrashes(s string) ([]Crash, error) {
	var out []Crash
	return out, eachFault(s, func(where string, at time.Duration, _ string) error {
		var c Crash
		if _, err := fmt.Sscanf(where, "%d/%d", &c.Region, &c.Node); err != nil {
			return fmt.Errorf("crash %q: want region/node@time", where)
		}
		c.At = at
		out = append(out, c)
		return nil
	})
}

// ParsePartitions reads "which@t1-t2,...": which is a region ("1": all
// its links, both ways), a link ("1<>2": both ways; "1>2": only from 1
// to 2), or one direction of all a region's links ("1>*": what leaves 1;
// "*>1": what reaches 1). E.g. "1@60s-120s,0>2@30s-40s".
func ParsePartitions(s string) ([]Partition, error) {
	var out []Partition
	return out, eachFault(s, func(where string, from time.Duration, rest string) error {
		bad := fmt.Errorf("partition %q: want region, a<>b, a>b, a>* or *>a, then @from-to", where)
		to, err := time.ParseDuration(rest)
		if rest == "" || err != nil {
			return errors.Join(bad, err)
		}
		p := Partition{From: from, To: to}
		atoi := func(s string) int {
			n, e := strconv.Atoi(s)
			if e != nil {
				err = bad
			}
			return n
		}
		if a, b, ok := strings.Cut(where, "<>"); ok {
			p.Region, p.Peer, p.Link = atoi(a), atoi(b), true
		} else if a, b, ok := strings.Cut(where, ">"); ok {
			switch {
			case a == "*":
				p.Region, p.Dir = atoi(b), In
			case b == "*":
				p.Region, p.Dir = atoi(a), Out
			default:
				p.Region, p.Peer, p.Link, p.Dir = atoi(a), atoi(b), true, Out
			}
		} else {
			p.Region = atoi(where)
		}
		if err != nil {
			return err
		}
		out = append(out, p)
		return nil
	})
}

// ParseFailovers reads "region@t:loss,...", e.g. "0@90s:500ms".
func ParseFailovers(s string) ([]Failover, error) {
	var out []Failover
	for _, f := range splitList(s) {
		at, loss, ok := strings.Cut(f, ":")
		if !ok {
			return nil, fmt.Errorf("failover %q: want region@time:loss", f)
		}
		l, err := time.ParseDuration(loss)
		if err != nil {
			return nil, fmt.Errorf("failover loss %q: %w", loss, err)
		}
		err = eachFault(at, func(where string, t time.Duration, _ string) error {
			r, err := strconv.Atoi(where)
			if err != nil {
				return fmt.Errorf("failover %q: want region@time:loss", f)
			}
			out = append(out, Failover{Region: r, At: t, Loss: l})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ParseCoordFailovers reads "region@t:after,...", e.g. "0@60s:10s".
func ParseCoordFailovers(s string) ([]CoordFailover, error) {
	fs, err := ParseFailovers(s)
	if err != nil {
		return nil, fmt.Errorf("coordinator %w", err)
	}
	var out []CoordFailover
	for _, f := range fs {
		out = append(out, CoordFailover{Region: f.Region, At: f.At, After: f.Loss})
	}
	return out, nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// eachFault splits "where@t[-rest]" items.
func eachFault(s string, fn func(where string, at time.Duration, rest string) error) error {
	for _, f := range splitList(s) {
		where, when, ok := strings.Cut(f, "@")
		if !ok {
			return fmt.Errorf("fault %q: want where@time", f)
		}
		from, rest, _ := strings.Cut(when, "-")
		at, err := time.ParseDuration(from)
		if err != nil {
			return fmt.Errorf("fault time %q: %w", from, err)
		}
		if err := fn(where, at, rest); err != nil {
			return err
		}
	}
	return nil
}
