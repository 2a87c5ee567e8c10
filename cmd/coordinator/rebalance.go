package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/coord"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/policystore"
	"github.com/allot-dev/allot/region"
)

// rebalanceFlags are the multi-region flags. With --region unset the
// coordinator only serves the admin API.
//
//	allot-coordinator --store nats://nats.eu:4222 --region eu --regions eu,us,ap \
//	    --nats nats://nats.eu:4222 --redis redis.eu:6379 --interval 10s
type rebalanceFlags struct {
	region, regions, natsURL, redis *string
	lockTTL                         *time.Duration
	knobs                           coord.Knobs
	// transport has the Redis and NATS credentials and TLS (tls.go).
	transport transport
	// observe receives every active epoch (metrics and a span per round).
	observe func(context.Context, coord.Round)
}

func addRebalanceFlags(fs *flag.FlagSet) *rebalanceFlags {
	d := coord.DefaultKnobs()
	f := &rebalanceFlags{
		region:  fs.String("region", "", "multi-region: this region's name; empty disables rebalancing"),
		regions: fs.String("regions", "", "multi-region: every region's name, comma-separated (this one included)"),
		natsURL: fs.String("nats", "", "multi-region: NATS URL of this region's cluster (gateways join the regions)"),
		redis:   fs.String("redis", "", "multi-region: this region's Redis, comma-separated for a cluster"),
		lockTTL: fs.Duration("lock-ttl", 5*time.Second, "multi-region: active/standby lock TTL (a standby takes over within it)"),
	}
	fs.DurationVar(&f.knobs.Interval, "interval", d.Interval, "multi-region: rebalance interval (equal in every region)")
	fs.Float64Var(&f.knobs.Gather, "gather", d.Gather, "multi-region: fraction of the interval each phase waits for the other regions")
	fs.Float64Var(&f.knobs.HeavyHitter, "heavy-hitter", d.HeavyHitter, "multi-region: demand above this fraction of a key's fair rate travels in reports")
	fs.Float64Var(&f.knobs.QuotaThreshold, "quota-threshold", d.QuotaThreshold, "multi-region: a global quota's count travels once it reaches this fraction of L/n in its window")
	fs.Float64Var(&f.knobs.Floor, "floor", d.Floor, "multi-region: share every region keeps, as a fraction of L/n")
	fs.Float64Var(&f.knobs.Headroom, "headroom", d.Headroom, "multi-region: margin over measured demand given before spare is split")
	fs.Float64Var(&f.knobs.Smoothing, "smoothing", d.Smoothing, "multi-region: weight of the newest interval in the smoothed demand (1 = none)")
	fs.Float64Var(&f.knobs.Decay, "decay", d.Decay, "multi-region: fraction of its excess over L/n an isolated region gives up per interval")
	fs.DurationVar(&f.knobs.ShareTTL, "share-ttl", d.ShareTTL, "multi-region: how long a written share outlives its last rewrite")
	return f
}

// start runs the region's coordinator next to the admin API, with the
// global limits of the policy store. The returned wait blocks until it
// stopped (ctx done) and releases its connections.
func (f *rebalanceFlags) start(ctx context.Context, st policystore.Store, log *slog.Logger) (wait func(), err error) {
	if *f.region == "" {
		return func() {}, nil
	}
	regions := splitList(*f.regions)
	if *f.natsURL == "" || *f.redis == "" || len(regions) < 2 {
		return nil, errors.New("--region needs --nats, --redis and --regions (at least two)")
	}
	if err := f.knobs.Validate(); err != nil {
		return nil, fmt.Errorf("multi-region knobs: %w", err)
	}
	if *f.lockTTL < 300*time.Millisecond {
		return nil, fmt.Errorf("--lock-ttl %v: want at least 300ms (it is renewed every third of it)", *f.lockTTL)
	}
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	rs, err := region.Open(ctx, splitList(*f.redis), f.transport.redis)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { rs.Close() })
	nc, err := nats.Connect(*f.natsURL, append([]nats.Option{nats.Name("allot-coordinator " + *f.region), nats.MaxReconnects(-1)}, f.transport.nats...)...)
	if err != nil {
		return nil, fmt.Errorf("nats %s: %w", *f.natsURL, err)
	}
	closers = append(closers, nc.Close)
	tr, err := coord.NewNATSTransport(nc, *f.region, log)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { tr.Close() })
	dem, err := coord.SubscribeDemand(nc, *f.region, log)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { dem.Close() })
	limits := coord.NewPolicyLimits(nil)
	c, err := coord.New(coord.Config{
		Region: *f.region, Regions: regions, Transport: tr, Demand: dem,
		Writer: coord.RedisWriter{Client: rs.Client()}, Limits: limits,
		Lock: &coord.RedisLock{Client: rs.Client(), Key: "allot:coordinator:{" + *f.region + "}", ID: instanceID(), TTL: *f.lockTTL},
		// Renewed three times per TTL, whatever the interval.
		LockRenew: *f.lockTTL / 3,
		Knobs:     f.knobs, Logger: log, Observe: f.observe,
	})
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	// The global limits and the runtime knobs follow the policy store.
	fl := &follower{source: st.String(), limits: limits, coord: c, flags: f.knobs, log: log}
	wg.Go(func() {
		if err := st.Watch(ctx, fl.apply); err != nil {
			log.Error("multi-region: policy watch ended", "err", err)
		}
	})
	wg.Go(func() {
		log.Info("multi-region coordinator running", "region", *f.region, "regions", regions, "interval", f.knobs.Interval)
		if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("multi-region coordinator stopped", "err", err)
		}
	})
	return func() { wg.Wait(); closeAll() }, nil
}

// follower applies policy-store snapshots to a running coordinator: the
// global limits, and the knobs (the flags overridden by the settings
// document's `rebalance:` block), so operators retune without a restart.
type follower struct {
	source string // the store, for validation errors
	limits *coord.PolicyLimits
	coord  *coord.Coordinator
	flags  coord.Knobs
	log    *slog.Logger
}

// apply takes one snapshot. A snapshot the nodes would reject (entries
// that do not decode, or a set that does not validate) changes nothing
// here either: the coordinator keeps the last good limits and knobs, as
// the nodes keep the last good set.
func (fl *follower) apply(s policystore.Snapshot) {
	if len(s.Problems) > 0 {
		fl.log.Warn("multi-region: policy snapshot has problems; keeping the last good limits and knobs", "problems", len(s.Problems))
		return
	}
	if err := policy.Validate(fl.source, s.File); err != nil {
		fl.log.Warn("multi-region: policy snapshot does not validate; keeping the last good limits and knobs", "err", err)
		return
	}
	fl.limits.Update(s.File)
	k, cur := fl.flags.With(s.File.Rebalance), fl.coord.Knobs()
	if k == cur {
		return
	}
	// The document is valid on its own but may still clash with a flag
	// (a share_ttl flag under two document intervals): SetKnobs refuses.
	if err := fl.coord.SetKnobs(k); err != nil {
		fl.log.Error("multi-region: knobs from the settings document rejected; keeping the current ones", "err", err)
		return
	}
	fl.log.Info("multi-region: knobs changed by the settings document", "from", cur, "to", k)
}

func splitList(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// instanceID names this process in the region's lock.
func instanceID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}
