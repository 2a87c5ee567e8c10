// Package coord runs a region's multi-region coordinator. Every epoch,
// and halfway through it a mid-interval round, it drains the region's
// per-key demand, exchanges reports with the other regions, computes the
// region's share of each global limit with package rebalance and writes
// it into the region's Redis buckets, where the scripts that spend them
// read it (check.lua and check_tb.lua on the exact path, lease.lua,
// part.lua); and it exchanges the counts of global quotas and writes the
// other regions' sum beside this region's.
//
// The protocol is Machine (machine.go): a pure state machine that takes
// time and messages as inputs (Tick, Step) and returns what to do (Ready,
// ready.go). It composes an inbox of the other regions' reports and acks
// (inbox.go), a planner (planner.go), a ledger of the shares it owns
// (ledger.go), a report builder (report.go) and global quotas' counts
// (quota.go); its clock is timing.go, and the round under way is one of
// two kinds, an epoch's (round.go) or a mid-interval round (mid.go).
// Coordinator is its thin driver (Turn, taken on real timers by Run), with
// I/O behind small interfaces so tests can cut any link: Transport (region
// to region: NATS, or an in-memory Hub), DemandSource (nodes to
// coordinator: package demand's Collector, or a DrainFunc in the same
// process), ShareWriter and QuotaStore (coordinator to Redis) and Locker
// (active/standby election). Each finished active round goes to
// Config.Observe as a Round. StartProcess assembles all of it for
// cmd/coordinator and the sandbox, following a policystore.Source for the
// limits and knobs (Follower, PolicyLimits).
//
// coord must not compute shares itself (rebalance does, purely), let a
// region grow before the shrinks that pay for it have been applied and
// acknowledged (docs/multi-region.md proves the protocol), or take part in
// a request's decision: it only writes what the scripts read. The Machine
// does no I/O and reads no clock.
package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// Locker elects the active coordinator of a region (RedisLock).
type Locker interface {
	// Hold acquires or renews the lock; true means this process is active.
	Hold(ctx context.Context) (bool, error)
	Release(ctx context.Context) error
}

// Config wires a Coordinator.
type Config struct {
	Region  string
	Regions []string // every region, Region included
	// Transport, Demand, Writer and Limits are required.
	Transport Transport
	Demand    DemandSource
	Writer    ShareWriter
	Limits    Limits
	// Quotas and QuotaStore enable the exchange of global quota counts;
	// nil takes Limits and Writer when they implement them (PolicyLimits
	// and RedisWriter do), else quotas are not exchanged.
	Quotas     Quotas
	QuotaStore QuotaStore
	// Lock is optional: nil makes this coordinator always active.
	Lock Locker
	// LockRenew is how often the active coordinator renews Lock while it
	// waits inside an epoch (it also renews at every epoch's start and
	// before growing). It must be well under the lock's TTL, which may be
	// shorter than an interval; zero means one second.
	LockRenew time.Duration
	// Knobs are the initial runtime settings; zero means DefaultKnobs.
	Knobs  Knobs
	Logger *slog.Logger
	// Now is the driver's clock; nil means time.Now. Waits arm real timers
	// from it, so tests of the protocol in virtual time drive a Machine
	// directly instead.
	Now func() time.Time
	// Observe, when set, is called by Run's goroutine after every epoch
	// this coordinator ran as the active one (metrics and a span per
	// round). It must not block: the next epoch waits for it.
	Observe func(ctx context.Context, r Round)
}

// Coordinator is one region's coordinator: a Machine and the driver that
// executes its Ready with real timers, the Transport, the DemandSource,
// the ShareWriter, the QuotaStore and the Locker. Run it once.
type Coordinator struct {
	cfg   Config
	log   *slog.Logger
	now   func() time.Time
	knobs atomic.Pointer[Knobs]
	stats atomic.Pointer[Stats]

	m *Machine // belongs to Run's goroutine
	// busy is the time spent inside the machine (its CPU work) so far, and
	// busyAt its value when the epoch under way started.
	busy, busyAt time.Duration
}

// New checks cfg and returns a Coordinator.
func New(cfg Config) (*Coordinator, error) {
	var errs []error
	if cfg.Transport == nil || cfg.Demand == nil || cfg.Writer == nil || cfg.Limits == nil {
		errs = append(errs, errors.New("transport, demand, writer and limits are required"))
	}
	if cfg.LockRenew <= 0 {
		cfg.LockRenew = time.Second
	}
	if q, ok := cfg.Limits.(Quotas); ok && cfg.Quotas == nil {
		cfg.Quotas = q
	}
	if qs, ok := cfg.Writer.(QuotaStore); ok && cfg.QuotaStore == nil {
		cfg.QuotaStore = qs
	}
	if cfg.QuotaStore == nil {
		cfg.Quotas = nil // nowhere to read or write counts: not exchanged
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	mc := MachineConfig{Region: cfg.Region, Regions: cfg.Regions, Limits: cfg.Limits, Quotas: cfg.Quotas,
		Knobs: cfg.Knobs, Logger: cfg.Logger}
	if cfg.Transport != nil {
		mc.MaxPayload = cfg.Transport.MaxPayload()
	}
	if cfg.Lock != nil {
		mc.LockRenew = cfg.LockRenew
	}
	if mc.Limits == nil {
		mc.Limits = StaticLimits{} // reported below, not by the machine
	}
	m, err := NewMachine(mc)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("coord: %w", err)
	}
	c := &Coordinator{cfg: cfg, log: cfg.Logger.With("region", cfg.Region), now: cfg.Now, m: m}
	if c.now == nil {
		c.now = time.Now
	}
	k := m.cfg.Knobs
	c.knobs.Store(&k)
	c.stats.Store(&Stats{})
	return c, nil
}

// SetKnobs replaces the runtime settings; the next epoch uses them. This
// is the hook for the policy store's settings document.
func (c *Coordinator) SetKnobs(k Knobs) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("coord: knobs: %w", err)
	}
	c.knobs.Store(&k)
	return nil
}

// Knobs returns the settings in force.
func (c *Coordinator) Knobs() Knobs { return *c.knobs.Load() }

// Stats returns the last active epoch's figures.
func (c *Coordinator) Stats() Stats { return *c.stats.Load() }

// Run drives the machine until ctx ends, then releases the lock and
// returns ctx's error (or an error if the transport closed). It closes
// nothing it was given.
func (c *Coordinator) Run(ctx context.Context) error {
	defer func() {
		if c.m.Active() && c.cfg.Lock != nil {
			// ctx is done; give the release a moment of its own so the
			// standby takes over now rather than after the TTL.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if err := c.cfg.Lock.Release(rctx); err != nil {
				c.log.Warn("coord: release lock", "err", err)
			}
		}
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var in Input
	for {
		next := c.Turn(ctx, c.now(), in)
		in = nil
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(next.Sub(c.now()), 0))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		case msg, ok := <-c.cfg.Transport.Messages():
			if !ok {
				return errors.New("coord: transport closed")
			}
			in = msg
		}
	}
}

// Turn is one turn of the driver: in (nil: none; a message from the
// transport, as Run receives them) is stepped into the machine, which is
// then told the time now, and its Ready is carried out with the
// configured I/O until it asks for nothing more. It returns when the
// machine next wants a turn. Run takes turns on real timers and the
// transport's messages; a simulator takes them on virtual time, its I/O
// answering at once. Like Run, it must be called from one goroutine.
func (c *Coordinator) Turn(ctx context.Context, now time.Time, in Input) time.Time {
	if k := *c.knobs.Load(); k != c.m.cfg.Knobs {
		_ = c.m.SetKnobs(k) // validated by SetKnobs
	}
	if in != nil {
		c.inside(func() { c.m.Step(in) })
	}
	c.inside(func() { c.m.Tick(now) })
	c.execute(ctx)
	return c.m.Next()
}

// inside runs f, a call into the machine, and counts its time as the
// coordinator's CPU work.
func (c *Coordinator) inside(f func()) {
	t0 := time.Now()
	f()
	c.busy += time.Since(t0)
}

// execute carries out the machine's Ready until it asks for nothing more,
// stepping every result back.
func (c *Coordinator) execute(ctx context.Context) {
	for {
		rd := c.m.Ready()
		if rd.Empty() {
			return
		}
		for _, msg := range rd.Messages {
			if err := c.cfg.Transport.Publish(ctx, msg); err != nil {
				c.log.Warn("coord: publish", "epoch", msg.GetEpoch(), "err", err)
			}
		}
		if rd.Drain {
			c.busyAt = c.busy
			tokens := map[string]float64{}
			c.cfg.Demand.Drain(func(key string, admitted, denied int64) {
				tokens[key] += float64(max(0, admitted) + max(0, denied))
			})
			c.inside(func() { c.m.Step(Drained{tokens}) })
		}
		if rd.Hold {
			held, err := true, error(nil)
			if c.cfg.Lock != nil {
				held, err = c.cfg.Lock.Hold(ctx)
			}
			c.inside(func() { c.m.Step(LockHeld{Held: held && err == nil, Err: err}) })
		}
		if rd.ReadCounts != nil {
			counts, err := c.cfg.QuotaStore.ReadCounts(ctx, rd.ReadCounts)
			c.inside(func() { c.m.Step(Counted{counts, err}) })
		}
		if rd.ReadShares {
			shares, err := c.cfg.Writer.ReadShares(ctx, rd.ShareKeys, c.cfg.Limits)
			c.inside(func() { c.m.Step(SharesRead{shares, err}) })
		}
		if len(rd.WriteQuotas) > 0 {
			err := c.cfg.QuotaStore.WriteRemote(ctx, rd.WriteQuotas)
			c.inside(func() { c.m.Step(QuotasWritten{err}) })
		}
		if len(rd.WriteShares) > 0 {
			err := c.cfg.Writer.WriteShares(ctx, rd.WriteShares)
			c.inside(func() { c.m.Step(SharesWritten{err}) })
		}
		if rd.Round != nil {
			r := *rd.Round
			r.Stats.Compute = c.busy - c.busyAt
			r.End = c.now()
			if !r.Stats.Mid {
				c.stats.Store(&r.Stats)
			}
			if c.cfg.Observe != nil {
				c.cfg.Observe(ctx, r)
			}
		}
	}
}
