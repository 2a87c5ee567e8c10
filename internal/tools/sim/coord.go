package sim

import (
	"fmt"
	"log/slog"
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
	// stopped: crashed (a coordinator failover); its pending events and
	// the messages still addressed to it are dropped.
	stopped bool
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
	return &coordinator{s: s, reg: reg, m: m, tickAt: -1, tickedAt: -1}, nil
}

// wall is the machines' clock: virtual time, Config.Phase past an epoch
// boundary at the start.
func (c *coordinator) wall() time.Time { return epoch0.Add(c.s.cfg.Phase + time.Duration(c.s.now)) }

func (c *coordinator) tick() {
	if c.stopped {
		return
	}
	c.m.Tick(c.wall())
	c.pump()
}

func (c *coordinator) step(in coord.Input) {
	if c.stopped {
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
			tokens := c.reg.demand
			c.reg.demand = map[string]float64{}
			c.m.Step(coord.Drained{Tokens: tokens})
		}
		if rd.Hold {
			c.m.Step(coord.LockHeld{Held: true}) // one coordinator per region
		}
		if rd.ReadCounts != nil {
			c.m.Step(coord.Counted{})
		}
		if rd.ReadShares {
			def := rebalance.Default(len(s.regions))
			shares := map[string]rebalance.Share{}
			for _, key := range rd.ShareKeys {
				shares[key] = c.reg.store.shareOf(s.now/1000, keyIndex(key), s.global, def)
			}
			c.m.Step(coord.SharesRead{Shares: shares})
		}
		if len(rd.WriteQuotas) > 0 {
			c.m.Step(coord.QuotasWritten{})
		}
		if us := rd.WriteShares; len(us) > 0 {
			there := int64(s.cfg.RedisRTT / 2)
			s.q.push(s.now+there, func() {
				for _, u := range us {
					c.reg.store.share(s.now/1000, u)
					s.met.shareSum(s, keyIndex(u.Key))
				}
				s.q.push(s.now+int64(s.cfg.RedisRTT)-there, func() { c.step(coord.SharesWritten{}) })
			})
		}
		if rd.Round != nil {
			c.epochs++
		}
	}
	c.arm()
}

// arm schedules the Tick the machine wants next, unless one is pending
// at that time already.
func (c *coordinator) arm() {
	at := max(int64(c.m.Next().Sub(epoch0)-c.s.cfg.Phase), c.s.now)
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
// (coord.Machine's takeover).
func (s *Sim) coordFailover(reg *region, next *coordinator, delay time.Duration) {
	reg.coord.stopped = true
	s.q.push(s.now+int64(delay), func() {
		reg.coord = next
		next.tick()
	})
}

// publish sends msg from region from to every other region, after the
// region latency, unless a partition cuts the link at sending time.
func (s *Sim) publish(from int, msg *coordv1.Message) {
	wire, err := proto.Marshal(msg)
	if err != nil {
		panic(fmt.Sprintf("sim: a coordinator message does not marshal: %v", err)) // the machine built it
	}
	for to, reg := range s.regions {
		if to == from || s.cut(from, to) {
			continue
		}
		s.q.push(s.now+int64(s.cfg.RegionLatency), func() {
			if s.cut(from, to) {
				return
			}
			reg.coord.step(coord.Received{Wire: wire})
		})
	}
}

// cut reports whether a partition separates regions a and b now.
func (s *Sim) cut(a, b int) bool {
	t := time.Duration(s.now)
	for _, p := range s.cfg.Partitions {
		if (p.Region == a || p.Region == b) && t >= p.From && t < p.To {
			return true
		}
	}
	return false
}
