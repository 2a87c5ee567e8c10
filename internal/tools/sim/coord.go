package sim

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/coord/demand"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// coordinator is one coordinator process of a region: a real
// coord.Coordinator, the production driver (its Turn: step a message in,
// tick the machine, carry out its Ready through the I/O interfaces) over
// a real coord.Machine, taking turns on virtual time. Its I/O is the
// simulated world's:
//
//   - Transport (coordTransport): Publish marshals the message and sends
//     it to every other region through the region links (latency,
//     jitter, loss, partitions: links.go), where it is delivered as a
//     turn with coord.Received. Messages is nil: deliveries are events.
//     A region's own coordinators are not sent its messages (the machine
//     ignores its own region's).
//   - DemandSource: a demand.Sum, the coordinator side of the demand
//     wire (demand.Collector without NATS): the region's nodes send it
//     the snapshots demand.Snapshots makes (node.publish).
//   - Locker (coordLock): lock_hold.lua and lock_release.lua with
//     coord.RedisLock's arguments on the region's simulated Redis, so
//     two coordinators of a region contend for one lock key.
//   - ShareWriter (coordWriter): share.lua with coord.RedisWriter's
//     arguments (coord.ShareArgs); reads are HGET rate, read as
//     coord.ShareOfRate reads it.
//   - QuotaStore: none. No simulated key is a quota (every key is a
//     global token bucket: limits implements no coord.Quotas), so the
//     machine never asks for counts and quota.lua does not run.
//
// Every Redis call fails while the region's Redis is down
// (Config.Outages), decided when the call would reach it.
//
// Latency. Turn's I/O answers at once, as the driver's calls return, so
// the time they take is modelled around it: each Redis call of a turn
// adds a round trip (--redis-rtt, each way with --jitter's coord part)
// to the turn's elapsed time, as the real driver waits for every reply
// in turn. The messages a turn publishes leave when the calls before
// them have returned (elapsed time after the turn's instant); share
// writes land in the store when they reach Redis (half a round trip
// after they are sent); the next turn, and any message arriving
// meanwhile, waits for the turn's calls to end. So an ack never leaves
// before the shrinks it acknowledges have landed, as in the real
// driver, and nodes see a share when Redis has it. Lock calls and share
// reads see the store as it is at the turn's instant (a round trip
// early at most: a millisecond at the defaults).
type coordinator struct {
	s   *Sim
	reg *region
	co  *coord.Coordinator
	id  string // its lock holder id
	// demand is what the region's nodes published since its last drain.
	demand demand.Sum
	// turnAt is the pending timed turn's time; -1: none. lastTimed is
	// the time of the last timed turn.
	turnAt, lastTimed int64
	// elapsed is, during a turn, how long its Redis calls so far took;
	// busy is when the last turn's calls ended.
	elapsed, busy int64
	epochs        int
	// started: its process runs (subscribed to the region's messages
	// and demand, taking turns); stopped: crashed. Its pending turns are
	// dropped after.
	started, stopped bool
	// blind: it takes itself to hold the lock whatever the key holds,
	// unless Redis is down (an Overlap's old coordinator, until the
	// Overlap's end).
	blind bool
}

// lockTTL is the coordinators' lock TTL, coord.StartProcess's default;
// they renew it every third of it, as StartProcess does.
const lockTTL = 5 * time.Second

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
	c := &coordinator{s: s, reg: reg, turnAt: -1, lastTimed: -1, id: reg.name + "-" + strconv.Itoa(len(reg.all))}
	co, err := coord.New(coord.Config{
		Region: reg.name, Regions: names, Transport: coordTransport{c}, Demand: &c.demand,
		Writer: coordWriter{c}, Limits: limits{s.global}, Lock: coordLock{c}, LockRenew: lockTTL / 3,
		Knobs: k, Logger: slog.New(slog.DiscardHandler), Now: c.wall,
		Observe: func(context.Context, coord.Round) { c.epochs++ },
	})
	if err != nil {
		return nil, err
	}
	c.co = co
	reg.all = append(reg.all, c)
	return c, nil
}

// wall is the coordinators' clock: virtual time, Config.Phase past an
// epoch boundary at the start, plus the region's coordinators' offset.
func (c *coordinator) wall() time.Time {
	return epoch0.Add(c.s.cfg.Phase + c.reg.coordOff + time.Duration(c.s.now))
}

// start starts the process now: it subscribes to the region's messages
// and demand and takes its first turn.
func (c *coordinator) start() {
	c.started = true
	c.reg.coords = append(c.reg.coords, c)
	c.turn(nil)
}

// turn is one turn of the driver now with in (nil: a timed turn), then
// the next timed turn is armed.
func (c *coordinator) turn(in coord.Input) {
	s := c.s
	if c.stopped || !c.started {
		return
	}
	if s.now < c.busy {
		// The last turn's calls are under way: a message waits for them.
		s.q.push(c.busy, func() { c.turn(in) })
		return
	}
	c.elapsed = 0
	next := c.co.Turn(context.Background(), c.wall(), in)
	c.busy = s.now + c.elapsed
	c.arm(next)
}

// arm schedules the timed turn the machine wants at next (on its clock),
// not before the turn's calls end, unless one is pending then already.
func (c *coordinator) arm(next time.Time) {
	s := c.s
	at := max(int64(next.Sub(epoch0)-s.cfg.Phase-c.reg.coordOff), c.busy, s.now)
	if at <= c.lastTimed {
		// The machine asks again for an instant it was given: with its
		// I/O answered within the turn it never should; a millisecond
		// later rather than spinning on virtual time.
		at = c.lastTimed + int64(time.Millisecond)
	}
	if c.turnAt == at {
		return
	}
	c.turnAt = at
	s.q.push(at, func() {
		if c.turnAt != at {
			return // superseded
		}
		c.turnAt, c.lastTimed = -1, at
		c.turn(nil)
	})
}

// call is one Redis call of the turn under way: it takes a round trip
// of the turn's time and reports when it reaches Redis, and whether it
// fails (the region's Redis down then).
func (c *coordinator) call() (arrives int64, err error) {
	s := c.s
	there, back := s.redisLegs(s.cfg.Jitter.Coord)
	arrives = s.now + c.elapsed + there
	c.elapsed += there + back
	if s.downAt(c.reg, arrives) {
		return arrives, errStoreDown
	}
	return arrives, nil
}

// coordTransport is a coordinator's coord.Transport.
type coordTransport struct{ c *coordinator }

// Publish sends m to every other region when the turn's calls so far
// have returned.
func (t coordTransport) Publish(_ context.Context, m *coordv1.Message) error {
	c := t.c
	wire, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("sim: marshal: %w", err)
	}
	c.s.publish(c.reg.idx, wire, c.s.now+c.elapsed)
	return nil
}

func (coordTransport) Messages() <-chan coord.Received { return nil }

// MaxPayload is NATS's default max payload.
func (coordTransport) MaxPayload() int { return 1 << 20 }

func (coordTransport) Close() error { return nil }

// coordLock is a coordinator's coord.Locker: lock_hold.lua and
// lock_release.lua on the region's Redis, coord.LockKey(region).
type coordLock struct{ c *coordinator }

func (l coordLock) Hold(context.Context) (bool, error) {
	c := l.c
	if _, err := c.call(); err != nil {
		return false, err
	}
	if c.blind {
		return true, nil // it misses that the key is gone or another's
	}
	return c.reg.store.hold(c.s.now/1000, coord.LockKey(c.reg.name), c.id, lockTTL), nil
}

func (l coordLock) Release(context.Context) error {
	c := l.c
	if _, err := c.call(); err != nil {
		return err
	}
	c.reg.store.release(c.s.now/1000, coord.LockKey(c.reg.name), c.id)
	return nil
}

// coordWriter is a coordinator's coord.ShareWriter.
type coordWriter struct{ c *coordinator }

// WriteShares lands every update (share.lua) when the call reaches
// Redis, unless Redis is down then.
func (w coordWriter) WriteShares(_ context.Context, us []coord.ShareUpdate) error {
	c := w.c
	at, err := c.call()
	if err != nil {
		return err
	}
	s, st := c.s, c.reg.store
	us = slices.Clone(us)
	s.q.push(at, func() {
		for _, u := range us {
			st.share(s.now/1000, u)
			s.met.shareSum(s, keyIndex(u.Key))
		}
	})
	return nil
}

// ReadShares reads each key's share in force (HGET rate) as
// coord.RedisWriter.ReadShares does: keys without one are left out.
func (w coordWriter) ReadShares(_ context.Context, keys []string, lim coord.Limits) (map[string]rebalance.Share, error) {
	c := w.c
	if _, err := c.call(); err != nil {
		return nil, err
	}
	out := map[string]rebalance.Share{}
	for _, key := range keys {
		l, ok := lim.Global(key)
		if !ok {
			continue
		}
		if sh, ok := c.reg.store.shareOf(c.s.now/1000, keyIndex(key), l); ok {
			out[key] = sh
		}
	}
	return out, nil
}

// coordFailover crashes reg's coordinators now (they stop without
// releasing the lock, as a killed process) and starts next after delay:
// a new process that subscribes then and takes the lock once the
// crashed one's has expired (lock_hold.lua; at most lockTTL after the
// crash), listens one epoch and reads the shares in force
// (coord.Machine's takeover).
func (s *Sim) coordFailover(reg *region, next *coordinator, delay time.Duration) {
	for _, old := range reg.coords {
		old.stopped = true
	}
	reg.coords = nil
	s.q.push(s.now+int64(delay), next.start)
}

// publish sends a message from region from, leaving at sent, to every
// other region, after the region latency and its jitter, through the
// lossy transport, unless a partition cuts the link at sending or at
// arrival time. Every coordinator subscribed in the region when it
// arrives takes a turn with it.
func (s *Sim) publish(from int, wire []byte, sent int64) {
	for to, reg := range s.regions {
		if to == from || s.cutAt(from, to, sent) {
			continue
		}
		s.transmitAt(sent, s.cfg.RegionLatency, s.cfg.Jitter.Region, func() {
			if s.cut(from, to) {
				return
			}
			for _, co := range slices.Clone(reg.coords) {
				co.turn(coord.Received{Wire: wire})
			}
		})
	}
}
