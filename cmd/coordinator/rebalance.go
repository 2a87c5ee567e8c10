package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/policystore"
)

// rebalanceFlags are the multi-region flags. With --region unset the
// coordinator only serves the admin API. The rebalance knobs are not
// flags: they are the policy file's rebalance: block over
// coord.DefaultKnobs (docs/multi-region.md, "Knobs"), one source that
// every region's coordinator reads and that changes without a restart.
//
//	allot-coordinator --store nats://nats.eu:4222 --region eu --regions eu,us,ap \
//	    --nats nats://nats.eu:4222 --redis redis.eu:6379
type rebalanceFlags struct {
	region, regions, natsURL, redis *string
	lockTTL                         *time.Duration
	// transport has the Redis addresses and credentials, NATS options
	// and TLS (tls.go).
	transport transport
	// observe receives every active epoch (metrics and a span per round).
	observe func(context.Context, coord.Round)
}

func addRebalanceFlags(fs *flag.FlagSet) *rebalanceFlags {
	return &rebalanceFlags{
		region:  fs.String("region", "", "multi-region: this region's name; empty disables rebalancing"),
		regions: fs.String("regions", "", "multi-region: every region's name, comma-separated (this one included)"),
		natsURL: fs.String("nats", "", "multi-region: NATS URL of this region's cluster (nats://[USER:PASSWORD@]HOST:PORT, tls:// for TLS; gateways join the regions)"),
		redis:   fs.String("redis", "", "multi-region: this region's Redis, as allot-node's --redis (addresses, or a redis[s]://[USER:PASSWORD@]HOST:PORT,... URL)"),
		lockTTL: fs.Duration("lock-ttl", 5*time.Second, "multi-region: active/standby lock TTL (a standby takes over within it)"),
	}
}

// start runs the region's coordinator (coord.StartProcess) next to the
// admin API, with the global limits and knobs of the policy store (its
// rebalance: block over coord.DefaultKnobs). The
// returned wait blocks until it stopped (ctx done) and releases its
// connections.
func (f *rebalanceFlags) start(ctx context.Context, st policystore.Source, log *slog.Logger) (wait func(), err error) {
	if *f.region == "" {
		return func() {}, nil
	}
	regions := cli.List(*f.regions)
	if *f.natsURL == "" || len(f.transport.redisAddrs) == 0 || len(regions) < 2 {
		return nil, errors.New("--region needs --nats, --redis and --regions (at least two)")
	}
	if *f.lockTTL < 300*time.Millisecond {
		return nil, fmt.Errorf("--lock-ttl %v: want at least 300ms (it is renewed every third of it)", *f.lockTTL)
	}
	c, err := coord.StartProcess(ctx, coord.ProcessConfig{
		Region: *f.region, Regions: regions,
		NATSURL: *f.natsURL, NATSOptions: f.transport.nats,
		RedisAddrs: f.transport.redisAddrs, RedisOptions: f.transport.redis,
		PolicySource: st, Knobs: coord.DefaultKnobs(), LockTTL: *f.lockTTL, Logger: log, Observe: f.observe,
	})
	if err != nil {
		return nil, err
	}
	return c.Wait, nil
}
