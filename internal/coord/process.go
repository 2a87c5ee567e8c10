package coord

// This file assembles a region's coordinator process the way package node
// assembles a node: the region's Redis (share writer, quota store,
// active/standby lock), its NATS (the transport between regions and the
// nodes' demand), and the policy store, whose global limits and
// `rebalance:` knobs the coordinator follows. cmd/coordinator and the
// sandbox both run it.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/coord/demand"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/region"
)

// ProcessConfig wires a Process.
type ProcessConfig struct {
	Region  string
	Regions []string // every region, Region included (at least two)
	// NATSURL is this region's NATS cluster (gateways join the regions).
	NATSURL     string
	NATSOptions []nats.Option
	// RedisAddrs is this region's Redis (several for a cluster).
	RedisAddrs   []string
	RedisOptions region.Options
	// PolicySource is where the limits and knobs come from. Required;
	// the caller closes it after Stop.
	PolicySource policystore.Source
	// Knobs are the base knobs (allot-coordinator: DefaultKnobs);
	// the settings document's `rebalance:` block overrides them at
	// runtime.
	Knobs Knobs
	// LockTTL is the active/standby lock's TTL (renewed every third of
	// it); a standby takes over within it. Zero means 5 s.
	LockTTL time.Duration
	// ID names this process in the region's lock; empty means
	// host-pid-random.
	ID      string
	Logger  *slog.Logger
	Observe func(context.Context, Round)
}

// LockKey is the Redis key of region's active/standby lock.
func LockKey(region string) string { return "allot:coordinator:{" + region + "}" }

// Process is a running region coordinator: the Coordinator and its links.
type Process struct {
	id     string
	co     *Coordinator
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closer []func()
	lock   *crashLock
	once   sync.Once
}

// crashLock is the region lock with a crash switch: a crashed coordinator
// does not release its lock on the way out (Run does on a clean
// stop), so the standby takes over only when the TTL runs out, as after a
// killed process.
type crashLock struct {
	Locker
	crashed atomic.Bool
}

func (l *crashLock) Release(ctx context.Context) error {
	if l.crashed.Load() {
		return nil
	}
	return l.Locker.Release(ctx)
}

// StartProcess connects to the region's Redis and NATS and runs the coordinator
// until ctx ends or Stop.
func StartProcess(ctx context.Context, cfg ProcessConfig) (_ *Process, err error) {
	if cfg.Region == "" || cfg.NATSURL == "" || len(cfg.RedisAddrs) == 0 || len(cfg.Regions) < 2 || cfg.PolicySource == nil {
		return nil, errors.New("coordinator: needs a region, NATS, Redis, a policy store and at least two regions")
	}
	if cfg.LockTTL == 0 {
		cfg.LockTTL = 5 * time.Second
	}
	if cfg.LockTTL < 300*time.Millisecond {
		return nil, fmt.Errorf("coordinator: lock TTL %v: want at least 300ms (it is renewed every third of it)", cfg.LockTTL)
	}
	if err := cfg.Knobs.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator: knobs: %w", err)
	}
	if cfg.ID == "" {
		cfg.ID = instanceID()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Process{id: cfg.ID}
	defer func() {
		if err != nil {
			c.closeAll()
		}
	}()
	ro := cfg.RedisOptions
	ro.NoWarmUp = true // it sends no decision scripts (region.Options.NoWarmUp)
	rs, err := region.Open(ctx, cfg.RedisAddrs, ro)
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", cfg.ID, err)
	}
	c.closer = append(c.closer, func() { rs.Close() })
	opts := append([]nats.Option{nats.Name("allot-coordinator " + cfg.Region), nats.MaxReconnects(-1)}, cfg.NATSOptions...)
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: nats %s: %w", cfg.ID, cfg.NATSURL, err)
	}
	c.closer = append(c.closer, nc.Close)
	tr, err := NewNATSTransport(nc, cfg.Region, log)
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", cfg.ID, err)
	}
	c.closer = append(c.closer, func() { tr.Close() })
	dem, err := demand.Collect(nc, cfg.Region, log)
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", cfg.ID, err)
	}
	c.closer = append(c.closer, func() { dem.Close() })
	limits := NewPolicyLimits(nil)
	knobs := initialKnobs(ctx, cfg.PolicySource, cfg.Knobs, log)
	c.lock = &crashLock{Locker: &RedisLock{Client: rs.Client(), Key: LockKey(cfg.Region), ID: cfg.ID, TTL: cfg.LockTTL}}
	co, err := New(Config{
		Region: cfg.Region, Regions: cfg.Regions, Transport: tr, Demand: dem,
		Writer: RedisWriter{Client: rs.Client()}, Limits: limits, Lock: c.lock,
		// Renewed three times per TTL, whatever the interval.
		LockRenew: cfg.LockTTL / 3,
		Knobs:     knobs, Logger: log, Observe: cfg.Observe,
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", cfg.ID, err)
	}
	c.co = co
	runCtx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	fl := &Follower{Source: cfg.PolicySource.String(), Limits: limits, Coord: co, Base: cfg.Knobs, Log: log}
	c.wg.Go(func() {
		if err := cfg.PolicySource.Watch(runCtx, fl.Apply); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("coordinator: policy watch ended", "id", cfg.ID, "err", err)
		}
	})
	c.wg.Go(func() {
		log.Info("multi-region coordinator running", "region", cfg.Region, "regions", cfg.Regions, "interval", knobs.Interval, "id", cfg.ID)
		if err := co.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("multi-region coordinator stopped", "id", cfg.ID, "err", err)
		}
	})
	return c, nil
}

// initialKnobs are the knobs of the first epoch: base with the settings
// document's rebalance: block, read before the coordinator runs, so a
// document's interval holds from the first epoch rather than from the
// one after the first snapshot (an epoch of base's 10 s). A store that
// cannot be read, or a block that clashes with base, leaves base; the
// Follower applies the document once it arrives.
func initialKnobs(ctx context.Context, st policystore.Source, base Knobs, log *slog.Logger) Knobs {
	s, err := st.Settings(ctx)
	if err != nil {
		log.Warn("multi-region: settings document not read at start; knobs follow it once the store answers", "err", err)
		return base
	}
	k := base.With(s.Rebalance)
	if err := k.Validate(); err != nil {
		log.Error("multi-region: knobs from the settings document rejected; keeping the defaults", "err", err)
		return base
	}
	return k
}

// ID is the name of this process in the region's lock.
func (c *Process) ID() string { return c.id }

// Coord is the running coordinator (its knobs and stats).
func (c *Process) Coord() *Coordinator { return c.co }

// Wait blocks until the coordinator stopped (its ctx ended, or Stop), then
// closes its connections.
func (c *Process) Wait() {
	c.wg.Wait()
	c.closeAll()
}

// Stop ends the coordinator, releasing the region's lock if it holds it,
// and waits for it.
func (c *Process) Stop() {
	c.cancel()
	c.Wait()
}

// Crash ends the coordinator without releasing its lock: the standby
// takes over only when the lock's TTL runs out.
func (c *Process) Crash() {
	c.lock.crashed.Store(true)
	c.Stop()
}

func (c *Process) closeAll() {
	c.once.Do(func() {
		for i := len(c.closer) - 1; i >= 0; i-- {
			c.closer[i]()
		}
	})
}

// Follower applies policy-store snapshots to a running coordinator: the
// global limits, and the knobs (Base overridden by the settings
// document's `rebalance:` block), so operators retune without a restart.
type Follower struct {
	Source string // the store, for validation errors
	Limits *PolicyLimits
	Coord  *Coordinator
	Base   Knobs
	Log    *slog.Logger
}

// Apply takes one snapshot. A snapshot the nodes would reject (entries
// that do not decode, or a set that does not compile) changes nothing
// here either: the coordinator keeps the last good limits and knobs, as
// the nodes keep the last good set.
func (fl *Follower) Apply(s policystore.Snapshot) {
	if len(s.Problems) > 0 {
		fl.Log.Warn("multi-region: policy snapshot has problems; keeping the last good limits and knobs", "problems", len(s.Problems))
		return
	}
	// The nodes' own compilation: limits are read from the compiled set,
	// never from the file again.
	set, err := policy.Compile(fl.Source, s.File)
	if err != nil {
		fl.Log.Warn("multi-region: policy snapshot does not validate; keeping the last good limits and knobs", "err", err)
		return
	}
	fl.Limits.Update(set)
	k, cur := fl.Base.With(s.File.Rebalance), fl.Coord.Knobs()
	if k == cur {
		return
	}
	// The document is valid on its own but may still clash with a base
	// knob (a default share_ttl under two document intervals): SetKnobs
	// refuses.
	if err := fl.Coord.SetKnobs(k); err != nil {
		fl.Log.Error("multi-region: knobs from the settings document rejected; keeping the current ones", "err", err)
		return
	}
	fl.Log.Info("multi-region: knobs changed by the settings document", "from", cur, "to", k)
}

// instanceID names this process in the region's lock.
func instanceID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}
