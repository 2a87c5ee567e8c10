package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

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
	lock   *crashLock
}

// crashLock is the coordinator's lock with a crash switch: a crashed
// coordinator does not release its lock on the way out (coord.Run does
// on a clean stop), so the standby takes over only when the lock's TTL
// runs out, as after a killed process.
type crashLock struct {
	coord.Locker
	crashed atomic.Bool
}

func (l *crashLock) Release(ctx context.Context) error {
	if l.crashed.Load() {
		return nil
	}
	return l.Locker.Release(ctx)
}

func lockKey(regionName string) string { return "allot:coordinator:{" + regionName + "}" }

func startCoordinator(ctx context.Context, id, regionName string, regions, redisAddrs []string, natsURL, policiesPath string, knobs coord.Knobs, lockTTL time.Duration, log *slog.Logger) (_ *coordinator, err error) {
	c := &coordinator{id: id}
	defer func() {
		if err != nil {
			c.stop(false)
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
	c.lock = &crashLock{Locker: &coord.RedisLock{Client: rs.Client(), Key: lockKey(regionName), ID: id, TTL: lockTTL}}
	co, err := coord.New(coord.Config{
		Region: regionName, Regions: regions, Transport: tr, Demand: dem,
		Writer: coord.RedisWriter{Client: rs.Client()}, Limits: limits,
		Lock:  c.lock,
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
// its connections in reverse order. crash skips the lock's release.
func (c *coordinator) stop(crash bool) {
	if c.lock != nil {
		c.lock.crashed.Store(crash)
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	for i := len(c.close) - 1; i >= 0; i-- {
		c.close[i]()
	}
	c.close = nil
}

// ActiveCoordinator is the index of the region's coordinator that holds
// the lock now, read from Redis, or -1 if none of its running ones does.
func (r *Region) ActiveCoordinator(ctx context.Context) (int, error) {
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: r.RedisAddrs})
	defer c.Close()
	id, err := c.Get(ctx, lockKey(r.Name)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return -1, fmt.Errorf("sandbox: %s coordinator lock: %w", r.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, co := range r.coords {
		if co != nil && co.id == id {
			return i, nil
		}
	}
	return -1, nil
}
