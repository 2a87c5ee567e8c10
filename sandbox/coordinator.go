package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/coord"
	"github.com/allot-dev/allot/policystore"
	"github.com/allot-dev/allot/region"
)

// coordinator is one region coordinator run in process the way
// cmd/coordinator runs it (rebalance.go): NATS transport and demand,
// Redis share writer and lock, limits following the policy store.
type coordinator struct {
	id     string
	cancel context.CancelFunc
	wg     sync.WaitGroup
	close  []func()
}

func lockKey(regionName string) string { return "allot:coordinator:{" + regionName + "}" }

func startCoordinator(ctx context.Context, id, regionName string, regions, redisAddrs []string, natsURL, policiesPath string, knobs coord.Knobs, lockTTL time.Duration, log *slog.Logger) (_ *coordinator, err error) {
	c := &coordinator{id: id}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	rs, err := region.Open(ctx, redisAddrs, region.Options{})
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", id, err)
	}
	c.close = append(c.close, func() { rs.Close() })
	nc, err := nats.Connect(natsURL, nats.Name("allot-coordinator "+id), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: nats %s: %w", id, natsURL, err)
	}
	c.close = append(c.close, nc.Close)
	tr, err := coord.NewNATSTransport(nc, regionName, log)
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", id, err)
	}
	c.close = append(c.close, func() { tr.Close() })
	dem, err := coord.SubscribeDemand(nc, regionName, log)
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", id, err)
	}
	c.close = append(c.close, func() { dem.Close() })
	st, err := policystore.Open(ctx, "file:"+policiesPath, policystore.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", id, err)
	}
	c.close = append(c.close, func() { st.Close() })
	limits := coord.NewPolicyLimits(nil)
	co, err := coord.New(coord.Config{
		Region: regionName, Regions: regions, Transport: tr, Demand: dem,
		Writer: coord.RedisWriter{Client: rs.Client()}, Limits: limits,
		Lock:  &coord.RedisLock{Client: rs.Client(), Key: lockKey(regionName), ID: id, TTL: lockTTL},
		Knobs: knobs, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", id, err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	c.wg.Go(func() {
		err := st.Watch(runCtx, func(s policystore.Snapshot) {
			if len(s.Problems) == 0 {
				limits.Update(s.File)
			}
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Error("sandbox: coordinator policy watch ended", "id", id, "err", err)
		}
	})
	c.wg.Go(func() {
		if err := co.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
			log.Error("sandbox: coordinator stopped", "id", id, "err", err)
		}
	})
	return c, nil
}

// stop ends the coordinator and waits for its goroutines, then closes
// its connections in reverse order.
func (c *coordinator) stop() {
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	for i := len(c.close) - 1; i >= 0; i-- {
		c.close[i]()
	}
	c.close = nil
}
