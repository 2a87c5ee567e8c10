package sim

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/coord"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// coordinator drives one region's real coord.Machine as
// coord.Coordinator.Run does, with the I/O on the event queue: demand
// comes from the region's nodes, reports and acks travel to the other
// regions after the region latency (or are dropped by a partition), share
// writes land in the region's store half a Redis round trip after they
// are asked for and are acknowledged a round trip after.
type coordinator struct {
	s      *Sim
	reg    *region
	m      *coord.Machine
	tickAt int64 // the pending Tick event's time; -1: none
	// tickedAt is the time of the last Tick event.
	tickedAt int64
	epochs   int
	// demand is what the region's nodes published since its last drain.
	demand map[string]float64
	// started: ticking (a standby waiting to take over is not yet);
	// stopped: crashed, or it lost its lock at an overlap's end. Messages
	// reach it only in between, and its pending events are dropped after.
	started, stopped bool
}

// limits is every key's global limit: every simulated key is global.
type limits struct{ l coord.Limit }

func (l limits) Global(key string) (coord.Limit, bool) {
	return l.l, strings.HasPrefix(key, "rl:{")
}

// epoch0 is a whole number of any interval on the machines' clock: with
// Config.Phase 0, epochs start at virtual multiples of the interval.
var epoch0 = time.Unix(1_800_000_000, 0)

func newCoordinator(s *Sim, reg *region) (*coordinator, error) {
	k := coord.DefaultKnobs()
	k.Interval, k.Headroom, k.Gather = s.cfg.Interval, s.cfg.Headroom, s.cfg.Gather
	k.ShareTTL = max(k.ShareTTL, 2*k.Interval)
	names := make([]string, len(s.regions))
	for i := range names {
		names[i] = RegionName(i)
	}
	m, err := coord.NewMachine(coord.MachineConfig{
		Region: reg.name, Regions: names, Limits: limits{s.global}, Knobs: k,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	c := &coordinator{s: s, reg: reg, m: m, tickAt: -1, tickedAt: -1, demand: map[string]float64{}}
	reg.all = append(reg.all, c)
	return c, nil
}

// wall is the machines' clock: virtual time, Config.Phase past an epoch
// boundary at the start, plus the region's coordinators' offset.
func (c *coordinator) wall() time.Time {
	return epoch0.Add(c.s.cfg.Phase + c.reg.coordOff + time.Duration(c.s.now))
}

func (c *coordinator) tick() {
	if c.stopped {
		return
	}
	c.m.Tick(c.wall())
	c.pump()
}

func (c *coordinator) step(in coord.Input) {
	if c.stopped || !c.started {
		return
	}
	c.m.Step(in)
	c.pump()
}

// pump carries out the machine's Ready until it asks for nothing more,
// then arms the next Tick.
func (c *coordinator) pump() {
	s := c.s
	for {
		rd := c.m.Ready()
		if rd.Empty() {
			break
		}
		for _, msg := range rd.Messages {
			s.publish(c.reg.idx, msg)
		}
		if rd.Drain {
			tokens := c.demand
			c.demand = map[string]float64{}
			c.m.Step(coord.Drained{Tokens: tokens})
		}
		if rd.Hold {
			// The lock is in the region's Redis: an outage loses it. Any
			// coordinator that asks gets it otherwise (one per region, or
			// two that both believe they hold it: an Overlap).
			if s.down(c.reg) {
				c.m.Step(coord.LockHeld{Err: errStoreDown})
			} else {
				c.m.Step(coord.LockHeld{Held: true})
			}
		}
		if rd.ReadCounts != nil {
			c.m.Step(coord.Counted{})
		}
		if rd.ReadShares {
			c.readShares(rd.ShareKeys)
		}
		if len(rd.WriteQuotas) > 0 {
			c.m.Step(coord.QuotasWritten{})
		}
		if us := rd.WriteShares; len(us) > 0 {
			c.writeShares(us)
		}
		if rd.Round != nil {
			c.epochs++
		}
	}
	c.arm()
}

// readShares reads the shares in force of keys from the region's Redis,
// as coord.RedisWriter.ReadShares does, a round trip away.
func (c *coordinator) readShares(keys []string) {
	s := c.s
	there, back := s.redisLegs(s.cfg.Jitter.Coord)
	s.q.push(s.now+there, func() {
		in := coord.SharesRead{Err: errStoreDown}
		if !s.down(c.reg) {
			def := rebalance.Default(len(s.regions))
			in = coord.SharesRead{Shares: map[string]rebalance.Share{}}
			for _, key := range keys {
				sh, ok := c.reg.store.shareOf(s.now/1000, keyIndex(key), s.global)
				if !ok {
					sh = def
				}
				in.Shares[key] = sh
			}
		}
		s.q.push(s.now+back, func() { c.step(in) })
	})
}

// writeShares runs share.lua for each update in the region's Redis, half a
// round trip away, and acknowledges them the other half later.
func (c *coordinator) writeShares(us []coord.ShareUpdate) {
	s := c.s
	there, back := s.redisLegs(s.cfg.Jitter.Coord)
	s.q.push(s.now+there, func() {
		in := coord.SharesWritten{Err: errStoreDown}
		if !s.down(c.reg) {
			in.Err = nil
			for _, u := range us {
				c.reg.store.share(s.now/1000, u)
				s.met.shareSum(s, keyIndex(u.Key))
			}
		}
		s.q.push(s.now+back, func() { c.step(in) })
	})
}

// arm schedules the Tick the machine wants next, unless one is pending
// at that time already.
func (c *coordinator) arm() {
	at := max(int64(c.m.Next().Sub(epoch0)-c.s.cfg.Phase-c.reg.coordOff), c.s.now)
	if at <= c.tickedAt {
		// Next is an instant already ticked: the machine waits for an
		// I/O result (a share write), whose Step re-arms it. Ticking again
		// would spin on virtual time.
		return
	}
	if c.tickAt == at {
		return
	}
	c.tickAt = at
	c.s.q.push(at, func() {
		if c.tickAt != at {
			return // superseded
		}
		c.tickAt, c.tickedAt = -1, at
		c.tick()
	})
}

// coordFailover crashes reg's coordinator now and starts next after
// delay (the standby taking the lock): it is active at its first Hold, and
// listens one epoch before it reads the shares in force from the store
// (coord.Machine's takeover). The standby was subscribed all along: the
// demand the crashed one had not drained, and what the nodes publish
// meanwhile, is drained by next.
func (s *Sim) coordFailover(reg *region, next *coordinator, delay time.Duration) {
	for _, old := range reg.coords {
		old.stopped = true
		for k, v := range old.demand {
			next.demand[k] += v
		}
	}
	reg.coords = []*coordinator{next}
	s.q.push(s.now+int64(delay), func() {
		next.started = true
		next.tick()
	})
}

// publish sends msg from region from to every other region, after the
// region latency and its jitter, through the lossy transport, unless a
// partition cuts the link at sending or at arrival time. Every
// coordinator subscribed in the region receives it.
func (s *Sim) publish(from int, msg *coordv1.Message) {
	wire, err := proto.Marshal(msg)
	if err != nil {
		panic(fmt.Sprintf("sim: a coordinator message does not marshal: %v", err)) // the machine built it
	}
	for to, reg := range s.regions {
		if to == from || s.cut(from, to) {
			continue
		}
		s.transmit(s.cfg.RegionLatency, s.cfg.Jitter.Region, func() {
			if s.cut(from, to) {
				return
			}
			for _, co := range slices.Clone(reg.coords) {
				co.step(coord.Received{Wire: wire})
			}
		})
	}
}
