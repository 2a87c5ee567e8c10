// Package coord runs a region's multi-region coordinator: every epoch it
// collects the region's per-key demand, exchanges reports with the other
// regions, computes the region's share of each global limit with package
// rebalance and writes it into the region's Redis buckets, where the lease
// script reads it.
//
// Its I/O sits behind small interfaces so tests can cut any link:
// Transport (region to region: NATS, or an in-memory Hub), DemandSource
// (nodes to coordinator: NATS, or a lease.Manager's DrainDemand directly),
// ShareWriter (coordinator to Redis) and Locker (active/standby election).
//
// It must not compute shares itself (rebalance does, purely) or let a
// region grow before the shrinks that pay for it have been applied and
// acknowledged (docs/multi-region.md proves the protocol).
package coord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
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
	// Now is the clock that numbers epochs; nil means time.Now.
	Now func() time.Time
	// Observe, when set, is called by Run's goroutine after every epoch
	// this coordinator ran as the active one (metrics and a span per
	// round). It must not block: the next epoch waits for it.
	Observe func(ctx context.Context, r Round)
}

// Round describes one finished active epoch for Config.Observe.
type Round struct {
	Start, End time.Time // wall clock of the epoch's work
	Stats      Stats
	// Regions is how many regions share the global limits; Shares holds
	// this region's shares in force that differ from the default 1/Regions
	// (parts of rebalance.Unit), in no particular order and without keys,
	// so that observers can only aggregate them.
	Regions int
	Shares  []rebalance.Share
}

// Stats describe the last epoch this coordinator ran as the active one.
type Stats struct {
	Epoch int64
	// Heard is how many regions' complete reports were used (self too).
	Heard int
	// Group says every heard region acknowledged the same view, so
	// shares could grow.
	Group bool
	// Keys is how many keys were planned; Reported how many this region
	// reported; Written how many shares were written to Redis (changes
	// and refreshes of shares that are not the default).
	Keys, Reported, Written int
	// Quotas is how many global quota counts this region reported.
	Quotas int
	// ReportBytes and Chunks measure this region's report.
	ReportBytes, Chunks int
	// Compute is the time spent encoding, decoding and planning (the
	// coordinator's own CPU work, without waiting on the network or Redis).
	Compute time.Duration
	// Rounds is how many epochs this coordinator has run while active,
	// this one included. Epoch numbers follow the wall clock and skip
	// when the process stalls; Rounds does not.
	Rounds int64
}

// Coordinator is one region's coordinator. Run it once.
type Coordinator struct {
	cfg   Config
	log   *slog.Logger
	now   func() time.Time
	knobs atomic.Pointer[Knobs]
	stats atomic.Pointer[Stats]
	// ran counts the epochs this coordinator ran while active.
	ran atomic.Int64

	// The rest belongs to Run's goroutine.
	active    bool
	listening bool                                  // first epoch after becoming active: learn, do not act
	own       map[string]rebalance.Share            // this region's shares in force, when not the default
	weight    map[string]float64                    // smoothed demand of the keys this region reports
	last      map[string]map[string]rebalance.Share // region -> key -> its last heard share
	lastDrain time.Time
	rounds    map[roundID]*round
	quota     quotas
}

type roundID struct{ epoch, intervalMS int64 }

// round is what arrived from the other regions for one epoch.
type round struct {
	reports map[string]*assembly
	acks    map[string]*coordv1.Ack
}

type assembly struct {
	chunks  uint32
	got     map[uint32]bool
	entries []entry
}

func (a *assembly) complete() bool { return a.chunks > 0 && uint32(len(a.got)) == a.chunks }

// New checks cfg and returns a Coordinator.
func New(cfg Config) (*Coordinator, error) {
	var errs []error
	if cfg.Region == "" {
		errs = append(errs, errors.New("no region"))
	}
	if !slices.Contains(cfg.Regions, cfg.Region) {
		errs = append(errs, fmt.Errorf("region %q is not in regions %v", cfg.Region, cfg.Regions))
	}
	if cfg.Transport == nil || cfg.Demand == nil || cfg.Writer == nil || cfg.Limits == nil {
		errs = append(errs, errors.New("transport, demand, writer and limits are required"))
	}
	if cfg.LockRenew <= 0 {
		cfg.LockRenew = time.Second
	}
	if cfg.Knobs == (Knobs{}) {
		cfg.Knobs = DefaultKnobs()
	}
	if err := cfg.Knobs.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("coord: %w", err)
	}
	cfg.Regions = slices.Compact(slices.Sorted(slices.Values(cfg.Regions)))
	if q, ok := cfg.Limits.(Quotas); ok && cfg.Quotas == nil {
		cfg.Quotas = q
	}
	if qs, ok := cfg.Writer.(QuotaStore); ok && cfg.QuotaStore == nil {
		cfg.QuotaStore = qs
	}
	c := &Coordinator{
		cfg:    cfg,
		log:    cfg.Logger,
		now:    cfg.Now,
		own:    map[string]rebalance.Share{},
		weight: map[string]float64{},
		last:   map[string]map[string]rebalance.Share{},
		rounds: map[roundID]*round{},
		quota:  newQuotas(),
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.log = c.log.With("region", cfg.Region)
	if c.now == nil {
		c.now = time.Now
	}
	k := cfg.Knobs
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

// Run runs epochs until ctx ends, then releases the lock and returns
// ctx's error. It closes nothing it was given.
func (c *Coordinator) Run(ctx context.Context) error {
	defer func() {
		if c.active && c.cfg.Lock != nil {
			// ctx is done; give the release a moment of its own so the
			// standby takes over now rather than after the TTL.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if err := c.cfg.Lock.Release(rctx); err != nil {
				c.log.Warn("coord: release lock", "err", err)
			}
		}
	}()
	c.lastDrain = c.now()
	for {
		k := *c.knobs.Load()
		iv := k.Interval.Nanoseconds()
		next := (c.now().UnixNano()/iv + 1) * iv
		if err := c.collect(ctx, time.Unix(0, next), nil); err != nil {
			return err
		}
		c.epoch(ctx, next/iv, k, time.Unix(0, next))
	}
}

// collect files arriving messages until deadline or until done reports
// true. It returns ctx's error if ctx ends, or an error if the transport
// closed.
func (c *Coordinator) collect(ctx context.Context, deadline time.Time, done func() bool) error {
	d := deadline.Sub(c.now())
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	// The active coordinator keeps its lock alive while it waits: an
	// interval may be longer than the lock's TTL.
	var renew <-chan time.Time
	if c.cfg.Lock != nil && c.active {
		tk := time.NewTicker(c.cfg.LockRenew)
		defer tk.Stop()
		renew = tk.C
	}
	for {
		if done != nil && done() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-renew:
			if !c.elect(ctx) {
				renew = nil // standby now: the next epoch's start polls again
			}
		case m, ok := <-c.cfg.Transport.Messages():
			if !ok {
				return errors.New("coord: transport closed")
			}
			c.file(m)
		}
	}
}

// file stores a message in its round. Messages of this region (the
// standby's own reports are never needed: a new active reads its shares
// from Redis) and of unknown regions are ignored.
func (c *Coordinator) file(m *coordv1.Message) {
	from := m.GetRegion()
	if from == c.cfg.Region || !slices.Contains(c.cfg.Regions, from) {
		return
	}
	r := c.round(roundID{m.GetEpoch(), m.GetIntervalMs()})
	if r == nil {
		return
	}
	switch b := m.GetBody().(type) {
	case *coordv1.Message_Report:
		a := r.reports[from]
		if a == nil {
			a = &assembly{chunks: b.Report.GetChunks(), got: map[uint32]bool{}}
			r.reports[from] = a
		}
		ch := b.Report.GetChunk()
		if ch >= a.chunks || a.got[ch] || b.Report.GetChunks() != a.chunks {
			return
		}
		a.got[ch] = true
		a.entries = decodeEntries(b.Report.GetEntries(), a.entries)
	case *coordv1.Message_Ack:
		r.acks[from] = b.Ack
	}
}

// round returns the round of id, creating it. Rounds that started more
// than three of their intervals ago (or start more than two ahead: a
// skewed or bogus clock) are not kept.
func (c *Coordinator) round(id roundID) *round {
	now := c.now().UnixMilli()
	stale := func(r roundID) bool {
		iv := max(r.intervalMS, 1)
		start := r.epoch * iv
		return start < now-3*iv || start > now+2*iv
	}
	if stale(id) {
		return nil
	}
	for old := range c.rounds {
		if stale(old) {
			delete(c.rounds, old)
		}
	}
	r := c.rounds[id]
	if r == nil {
		r = &round{reports: map[string]*assembly{}, acks: map[string]*coordv1.Ack{}}
		c.rounds[id] = r
	}
	return r
}

// roundOrEmpty is round, or an empty round when this epoch runs so late
// that its messages are no longer kept: it then hears nobody, which is
// safe.
func (c *Coordinator) roundOrEmpty(id roundID) *round {
	if r := c.round(id); r != nil {
		return r
	}
	return &round{reports: map[string]*assembly{}, acks: map[string]*coordv1.Ack{}}
}

// epoch runs one epoch that started at start.
func (c *Coordinator) epoch(ctx context.Context, e int64, k Knobs, start time.Time) {
	rates := c.drain(start)
	if !c.elect(ctx) {
		return
	}
	id := roundID{e, k.Interval.Milliseconds()}
	phase := time.Duration(float64(k.Interval) * k.Gather)
	others := len(c.cfg.Regions) - 1
	if c.listening {
		c.listen(ctx, id, start.Add(phase))
		return
	}
	st := Stats{Epoch: e}
	t0 := time.Now()
	began := t0

	// Report: rates to share, and quota counts.
	mine := c.report(rates, k)
	quotaEntries := c.quotaReport(ctx, start, k)
	st.Quotas = len(quotaEntries)
	msgs := encodeReport(c.cfg.Region, id.epoch, id.intervalMS, append(slices.Clip(mine), quotaEntries...), c.cfg.Transport.MaxPayload())
	for _, m := range msgs {
		st.ReportBytes += protoSize(m)
		if err := c.cfg.Transport.Publish(ctx, m); err != nil {
			c.log.Warn("coord: publish report", "epoch", e, "err", err)
		}
	}
	st.Reported, st.Chunks = len(mine), len(msgs)
	st.Compute += time.Since(t0)

	r := c.roundOrEmpty(id)
	_ = c.collect(ctx, start.Add(phase), func() bool { return completeReports(r) == others })

	// Phase 1: shrink.
	t0 = time.Now()
	heard := c.heard(r)
	plans := c.plan(r, mine, heard, k)
	// Quota counts need no two phases: they only ever raise what a
	// region counts against its limit.
	c.fileQuotas(r, heard)
	remote := c.quotaUpdates(start)
	st.Compute += time.Since(t0)
	c.writeQuotas(ctx, remote)
	t0 = time.Now()
	st.Heard, st.Keys = len(heard), len(plans)
	shrinks := c.updates(plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Shrunk[kp.Self] }, k, true)
	st.Compute += time.Since(t0)
	ok := c.write(ctx, shrinks)
	st.Written += len(shrinks)
	ack := &coordv1.Message{Region: c.cfg.Region, Epoch: id.epoch, IntervalMs: id.intervalMS,
		Body: &coordv1.Message_Ack{Ack: &coordv1.Ack{Heard: heard, Ok: ok}}}
	if err := c.cfg.Transport.Publish(ctx, ack); err != nil {
		c.log.Warn("coord: publish ack", "epoch", e, "err", err)
	}

	// Phase 2: grow, only with every heard region's matching ack.
	_ = c.collect(ctx, start.Add(2*phase), func() bool { return c.acked(r, heard) })
	t0 = time.Now()
	st.Group = ok && len(heard) > 1 && c.group(r, heard)
	grows := c.updates(plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Grow(st.Group) }, k, false)
	st.Compute += time.Since(t0)
	if len(grows) > 0 && c.elect(ctx) { // a lost lock must not grow
		c.write(ctx, grows)
		st.Written += len(grows)
	}
	st.Rounds = c.ran.Add(1)
	c.stats.Store(&st)
	if c.cfg.Observe != nil {
		shares := make([]rebalance.Share, 0, len(c.own))
		for _, s := range c.own {
			shares = append(shares, s)
		}
		c.cfg.Observe(ctx, Round{Start: began, End: time.Now(), Stats: st, Regions: len(c.cfg.Regions), Shares: shares})
	}
	c.log.Debug("coord: epoch", "epoch", e, "heard", st.Heard, "group", st.Group, "keys", st.Keys, "written", st.Written, "report_bytes", st.ReportBytes)
}

// elect renews or takes the lock. Becoming active starts a listening
// epoch; losing the lock forgets this region's shares (the new active
// reads them from Redis).
func (c *Coordinator) elect(ctx context.Context) bool {
	if c.cfg.Lock == nil {
		if !c.active {
			c.active, c.listening = true, true
		}
		return true
	}
	held, err := c.cfg.Lock.Hold(ctx)
	if err != nil {
		c.log.Warn("coord: lock", "err", err)
		held = false
	}
	switch {
	case held && !c.active:
		c.log.Info("coord: active")
		c.active, c.listening = true, true
	case !held && c.active:
		c.log.Info("coord: standby")
		c.active = false
		clear(c.own)
		clear(c.weight)
		c.quota.reset()
	}
	return held
}

// listen spends a new active coordinator's first epoch learning which keys
// the other regions report, then reads this region's shares in force from
// Redis. It publishes nothing, so the others see this region as unheard
// and nobody grows meanwhile.
func (c *Coordinator) listen(ctx context.Context, id roundID, deadline time.Time) {
	r := c.roundOrEmpty(id)
	others := len(c.cfg.Regions) - 1
	_ = c.collect(ctx, deadline, func() bool { return completeReports(r) == others })
	c.heard(r)
	keys := map[string]bool{}
	for _, m := range c.last {
		for key := range m {
			keys[key] = true
		}
	}
	shares, err := c.cfg.Writer.ReadShares(ctx, slices.Sorted(maps.Keys(keys)), c.cfg.Limits)
	if err != nil {
		c.log.Warn("coord: read shares; listening another epoch", "err", err)
		return
	}
	def := rebalance.Default(len(c.cfg.Regions))
	for key, s := range shares {
		if s != def {
			c.own[key] = s
		}
	}
	c.listening = false
	c.log.Info("coord: took over", "keys", len(c.own))
}

// drain turns the demand since the last drain into rates (tokens/s).
func (c *Coordinator) drain(now time.Time) map[string]float64 {
	secs := now.Sub(c.lastDrain).Seconds()
	c.lastDrain = now
	rates := map[string]float64{}
	c.cfg.Demand.Drain(func(key string, admitted, denied int64) {
		rates[key] += float64(max(0, admitted) + max(0, denied))
	})
	c.noteDemand(slices.Collect(maps.Keys(rates)), now)
	if secs <= 0 {
		secs = 1e-3
	}
	for key := range rates {
		rates[key] /= secs
	}
	return rates
}

// report builds this region's report: the heavy hitters (demand of at
// least HeavyHitter of the key's fair rate) and every key whose share is
// not the default, so the others keep seeing what this region holds.
func (c *Coordinator) report(rates map[string]float64, k Knobs) []entry {
	n := float64(len(c.cfg.Regions))
	var out []entry
	seen := map[string]bool{}
	for key, rate := range rates {
		lim, ok := c.cfg.Limits.Global(key)
		if !ok || rate < k.HeavyHitter*lim.Rate/n || rate == 0 {
			continue
		}
		seen[key] = true
		c.weight[key] = rebalance.Smooth(c.weight[key], rate, k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rate), weight: float32(c.weight[key])})
	}
	for key, s := range c.own {
		if seen[key] {
			for i := range out {
				if out[i].key == key {
					out[i].share = s
				}
			}
			continue
		}
		if _, ok := c.cfg.Limits.Global(key); !ok {
			delete(c.own, key) // its policy is gone or no longer global
			continue
		}
		seen[key] = true
		c.weight[key] = rebalance.Smooth(c.weight[key], rates[key], k.Smoothing)
		out = append(out, entry{key: key, rate: float32(rates[key]), weight: float32(c.weight[key]), share: s})
	}
	for key := range c.weight {
		if !seen[key] {
			delete(c.weight, key)
		}
	}
	return out
}

// heard returns the sorted names of the regions whose complete reports of
// round r arrived (self always) and remembers their shares.
func (c *Coordinator) heard(r *round) []string {
	out := []string{c.cfg.Region}
	for name, a := range r.reports {
		if !a.complete() {
			continue
		}
		out = append(out, name)
		m := make(map[string]rebalance.Share, len(a.entries))
		for _, e := range a.entries {
			if e.share != 0 {
				m[e.key] = e.share
			}
		}
		c.last[name] = m
	}
	slices.Sort(out)
	return out
}

func completeReports(r *round) int {
	n := 0
	for _, a := range r.reports {
		if a.complete() {
			n++
		}
	}
	return n
}

// plan runs rebalance.Plan for every key of the heard reports. Every
// region's inputs are taken exactly as they travel (float32 demand), so
// regions with the same heard set compute bit-identical plans.
func (c *Coordinator) plan(r *round, mine []entry, heard []string, k Knobs) map[string]rebalance.KeyPlan {
	n := len(c.cfg.Regions)
	def := rebalance.Default(n)
	byRegion := map[string]map[string]entry{c.cfg.Region: index(mine)}
	keys := map[string]bool{}
	for _, e := range mine {
		keys[e.key] = true
	}
	for _, name := range heard {
		if a := r.reports[name]; a != nil && name != c.cfg.Region {
			byRegion[name] = index(a.entries)
			for _, e := range a.entries {
				keys[e.key] = true
			}
		}
	}
	params := rebalance.Params{Floor: k.Floor, Decay: k.Decay, Headroom: k.Headroom}
	plans := make(map[string]rebalance.KeyPlan, len(keys))
	regions := make([]rebalance.Region, n)
	for key := range keys {
		lim, ok := c.cfg.Limits.Global(key)
		if !ok {
			continue
		}
		for i, name := range c.cfg.Regions {
			reg := rebalance.Region{Name: name, Share: def}
			if m, ok := byRegion[name]; ok {
				reg.Heard = true
				if e, ok := m[key]; ok {
					reg.Demand = rebalance.Demand{Rate: float64(e.rate), Weight: float64(e.weight)}
					if e.share != 0 {
						reg.Share = e.share
					}
				}
			} else if s, ok := c.last[name][key]; ok {
				reg.Share = s
			}
			regions[i] = reg
		}
		plans[key] = rebalance.Plan(c.cfg.Region, regions, lim.Rate, params)
	}
	return plans
}

func index(es []entry) map[string]entry {
	m := make(map[string]entry, len(es))
	for _, e := range es {
		m[e.key] = e
	}
	return m
}

// updates lists the keys whose share pick(plan) differs from the one in
// force, sorted by key. With refresh it also lists the unchanged shares
// that are not the default: rewriting them every epoch re-creates a
// bucket that expired while idle (its share would otherwise fall back to
// the default, which may be more than this region holds) and renews TTLs.
func (c *Coordinator) updates(plans map[string]rebalance.KeyPlan, pick func(rebalance.KeyPlan) rebalance.Share, k Knobs, refresh bool) []ShareUpdate {
	n := len(c.cfg.Regions)
	def := rebalance.Default(n)
	var out []ShareUpdate
	for key, kp := range plans {
		if kp.Self < 0 {
			continue
		}
		s := pick(kp)
		cur, ok := c.own[key]
		if !ok {
			cur = def
		}
		if s == cur && (!refresh || !ok) {
			continue
		}
		lim, _ := c.cfg.Limits.Global(key)
		old := Limit{Rate: cur.Of(lim.Rate), Burst: cur.Of(lim.Burst)}
		out = append(out, ShareUpdate{Key: key, Share: s, Global: lim, Old: old, TTL: k.ShareTTL})
	}
	slices.SortFunc(out, func(a, b ShareUpdate) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// write applies us and records the shares in force. On failure some
// writes may have landed: each key is then recorded at the larger of its
// old and new share, so what this region reports never under-states what
// it may enforce.
func (c *Coordinator) write(ctx context.Context, us []ShareUpdate) bool {
	if len(us) == 0 {
		return true
	}
	err := c.cfg.Writer.WriteShares(ctx, us)
	if err != nil {
		c.log.Warn("coord: write shares", "n", len(us), "err", err)
	}
	def := rebalance.Default(len(c.cfg.Regions))
	for _, u := range us {
		cur, ok := c.own[u.Key]
		if !ok {
			cur = def
		}
		if err != nil && u.Share < cur {
			continue
		}
		if u.Share == def {
			delete(c.own, u.Key)
		} else {
			c.own[u.Key] = u.Share
		}
	}
	return err == nil
}

// acked reports whether every heard region's ack of round r arrived.
func (c *Coordinator) acked(r *round, heard []string) bool {
	for _, name := range heard {
		if name != c.cfg.Region && r.acks[name] == nil {
			return false
		}
	}
	return true
}

// group reports whether every heard region acknowledged, successfully, a
// plan made from exactly the same heard set.
func (c *Coordinator) group(r *round, heard []string) bool {
	for _, name := range heard {
		if name == c.cfg.Region {
			continue
		}
		a := r.acks[name]
		if a == nil || !a.GetOk() || !slices.Equal(a.GetHeard(), heard) {
			return false
		}
	}
	return true
}

func protoSize(m *coordv1.Message) int { return proto.Size(m) }
