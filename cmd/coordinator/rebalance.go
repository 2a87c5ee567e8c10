package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/coordinator"
	"github.com/allot-dev/allot/internal/policystore"
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

// start runs the region's coordinator (package coordinator) next to the
// admin API, with the global limits and knobs of the policy store. The
// returned wait blocks until it stopped (ctx done) and releases its
// connections.
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
	c, err := coordinator.Start(ctx, coordinator.Config{
		Region: *f.region, Regions: regions,
		NATSURL: *f.natsURL, NATSOptions: f.transport.nats,
		RedisAddrs: splitList(*f.redis), RedisOptions: f.transport.redis,
		Store: st, Knobs: f.knobs, LockTTL: *f.lockTTL, Logger: log, Observe: f.observe,
	})
	if err != nil {
		return nil, err
	}
	return c.Wait, nil
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
