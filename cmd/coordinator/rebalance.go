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
	rs, err := region.Open(ctx, splitList(*f.redis), region.Options{})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { rs.Close() })
	nc, err := nats.Connect(*f.natsURL, nats.Name("allot-coordinator "+*f.region), nats.MaxReconnects(-1))
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
		Lock:  &coord.RedisLock{Client: rs.Client(), Key: "allot:coordinator:{" + *f.region + "}", ID: instanceID(), TTL: *f.lockTTL},
		Knobs: f.knobs, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	// The global limits follow the policy store. The settings document
	// that will carry runtime knobs is to call c.SetKnobs the same way.
	wg.Go(func() {
		err := st.Watch(ctx, func(s policystore.Snapshot) {
			if len(s.Problems) > 0 {
				log.Warn("multi-region: policy snapshot has problems; keeping the last good limits", "problems", len(s.Problems))
				return
			}
			limits.Update(s.File)
		})
		if err != nil {
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
