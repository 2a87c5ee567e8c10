// Package loadgen drives load at Allot nodes and reports what they
// decided: throughput, latency quantiles, allowed, throttled and
// failed-open counts per region, and admitted tokens against an ideal
// limit over time (text, CSV and PNG). cmd/allot-load wraps it; the
// sandbox and the chaos suite call Run in process.
//
// # Scheduling
//
// Open loop (Config.Rate > 0): request i is due at start + i/Rate. Workers
// claim the next index, wait until it is due and send it; when every
// worker is busy the request leaves late, and its latency is measured from
// when it was due, not from when it left. A stalled server therefore shows
// up in the latency figures instead of silently slowing the generator down
// (the "coordinated omission" of closed-loop tools). Report.Lag says how
// late requests left, so a generator that could not keep up is visible.
//
// Closed loop (Rate == 0): Concurrency workers each send, wait for the
// answer and send again; latency is from send to answer. This measures
// capacity, not latency under a given load.
//
// # Determinism
//
// The region and key of request i are a pure function of (Seed, i) and,
// for the region, of the offset at which i is due (the split can shift
// mid-run). In open loop the offsets are fixed too, so two runs with the
// same configuration send exactly the same requests to the same regions.
// Within a region of several nodes the requests go to the nodes in turn,
// in the order they are sent: each node gets an equal part, but which
// request a node gets depends on timing.
//
// loadgen never sends to any address but the targets it is given.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// gen is one run in progress.
type gen struct {
	cfg     Config
	keys    *sampler
	router  *router
	regions []*region // in regionsOf order
	rec     *recorder
	start   time.Time
	next    atomic.Int64 // the next request index to claim
	cost    int64        // tokens one request takes, for the ideal
}

// Run sends load as cfg says until cfg.Duration has passed,
// cfg.MaxRequests have been sent or ctx is done, waits for the requests
// in flight (each bounded by cfg.Timeout) and returns the report. A run
// that ctx stops early still returns its report, with Stop set to
// StoppedInterrupted, and a nil error: what was measured until then is
// valid. Errors are for a configuration that cannot run.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	keys, err := newSampler(cfg.Keys)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	rt, err := newRouter(cfg.Targets, cfg.Split, cfg.ShiftAt, cfg.ShiftSplit)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	regions, err := dialAll(&cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, r := range regions {
			for i, c := range r.nodes {
				if err := c.Close(); err != nil {
					cfg.Logger.Warn("closing client", "region", r.name, "addr", r.addrs[i], "err", err)
				}
			}
		}
	}()
	g := &gen{cfg: cfg, keys: keys, router: rt, regions: regions, cost: 1}
	if c := cfg.Template.GetTokenCost(); c > 0 {
		g.cost = int64(c)
	}
	g.start = time.Now()
	g.rec = newRecorder(g.start, &g.cfg, len(regions))
	cfg.Logger.Info("load starting", "targets", cfg.Targets, "protocol", cfg.Protocol, "rate", cfg.Rate,
		"concurrency", cfg.Concurrency, "duration", cfg.Duration, "keys", cfg.Keys.String())

	var progress *progressLine
	if cfg.Progress != nil {
		progress = startProgress(g, cfg.Progress)
	}
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		if cfg.Rate > 0 {
			wg.Go(func() { g.openLoop(ctx) })
		} else {
			wg.Go(func() { g.closedLoop(ctx) })
		}
	}
	wg.Wait()
	if progress != nil {
		progress.stop()
	}
	return g.report(ctx.Err() != nil), nil
}

// region is one region's nodes, by address and client. Its requests go
// to the nodes in turn.
type region struct {
	name  string
	addrs []string
	nodes []Checker
	next  atomic.Uint64
}

// node returns the client of the region's next request.
func (r *region) node() Checker {
	return r.nodes[(r.next.Add(1)-1)%uint64(len(r.nodes))]
}

// dialAll dials every target and groups the clients by region, in
// regionsOf order.
func dialAll(cfg *Config) ([]*region, error) {
	names := regionsOf(cfg.Targets)
	out := make([]*region, len(names))
	for i, name := range names {
		out[i] = &region{name: name}
	}
	closeAll := func() error {
		var errs []error
		for _, r := range out {
			for _, c := range r.nodes {
				errs = append(errs, c.Close())
			}
		}
		return errors.Join(errs...)
	}
	for _, t := range cfg.Targets {
		var c Checker
		var err error
		switch {
		case cfg.Dial != nil:
			c, err = cfg.Dial(t)
		case cfg.Protocol == HTTP:
			c = NewHTTPChecker(t.Addr, cfg.Concurrency)
		default:
			c, err = DialGRPC(t.Addr, cfg.Conns)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("target %s=%s: %w", t.Region, t.Addr, err), closeAll())
		}
		r := out[slices.Index(names, t.Region)]
		r.addrs, r.nodes = append(r.addrs, t.Addr), append(r.nodes, c)
	}
	return out, nil
}

// claim returns the next request index, or false once MaxRequests are
// claimed.
func (g *gen) claim() (int64, bool) {
	i := g.next.Add(1) - 1
	if g.cfg.MaxRequests > 0 && i >= g.cfg.MaxRequests {
		return 0, false
	}
	return i, true
}

// due is the offset at which open-loop request i is due.
func (g *gen) due(i int64) time.Duration {
	return time.Duration(float64(i) * float64(time.Second) / g.cfg.Rate)
}

func (g *gen) openLoop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for ctx.Err() == nil {
		i, ok := g.claim()
		if !ok {
			return
		}
		at := g.due(i)
		if at >= g.cfg.Duration {
			return
		}
		due := g.start.Add(at)
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		g.send(ctx, i, at, due)
	}
}

func (g *gen) closedLoop(ctx context.Context) {
	for ctx.Err() == nil {
		now := time.Now()
		at := now.Sub(g.start)
		if at >= g.cfg.Duration && g.rec.measuredDone() >= g.cfg.MinMeasured {
			return
		}
		i, ok := g.claim()
		if !ok {
			return
		}
		g.send(ctx, i, at, now)
	}
}

// choose returns request i's region and key: a pure function of (Seed,
// i, at).
func (g *gen) choose(i int64, at time.Duration) (region, key int) {
	var src rand.PCG
	src.Seed(g.cfg.Seed, uint64(i))
	return g.router.pick(at, unit(src.Uint64())), g.keys.pick(unit(src.Uint64()))
}

// unit maps 64 random bits to [0, 1) with 53 bits of precision.
func unit(x uint64) float64 { return float64(x>>11) / (1 << 53) }

func (g *gen) request(key int) *ratelimitv1.RateLimitRequest {
	req := proto.Clone(g.cfg.Template).(*ratelimitv1.RateLimitRequest)
	switch g.cfg.KeyField {
	case Tenant:
		req.TenantId = g.cfg.KeyPrefix + strconv.Itoa(key)
	case IP:
		req.Ip = ipKey(key)
	default:
		req.ClientIdentifier = g.cfg.KeyPrefix + strconv.Itoa(key)
	}
	return req
}

// send issues request i, due at offset at (time due), and records it. The
// request does not inherit ctx's cancellation: a run stopped by ctx lets
// requests in flight finish (within Timeout), so every request sent is
// counted with its real outcome.
func (g *gen) send(ctx context.Context, i int64, at time.Duration, due time.Time) {
	region, key := g.choose(i, at)
	req := g.request(key)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.Timeout)
	sent := time.Now()
	d, err := g.regions[region].node().Check(rctx, req)
	end := time.Now()
	cancel()
	o := outcomeOf(d, err)
	if err != nil {
		g.cfg.Logger.Debug("check failed", "region", g.regions[region].name, "err", err)
	}
	g.rec.record(region, at, due, sent, end, key, g.cost, o)
}

// stopReason says why a finished run stopped.
func (g *gen) stopReason(interrupted bool) StopReason {
	switch {
	case interrupted:
		return StoppedInterrupted
	case g.cfg.MaxRequests > 0 && g.rec.done.Load() >= g.cfg.MaxRequests:
		return StoppedMaxRequests
	}
	return StoppedDuration
}
