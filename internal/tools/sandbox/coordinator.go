package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/policystore"
)

// coordinator is one region coordinator run in process by
// coord.StartProcess, as cmd/coordinator runs it, with its own policy store.
type coordinator struct {
	*coord.Process
	store policystore.Source
}

func startCoordinator(ctx context.Context, id, regionName string, regions, redisAddrs []string, natsURL, policiesPath string, knobs coord.Knobs, lockTTL time.Duration, log *slog.Logger) (*coordinator, error) {
	st, err := policystore.Open(ctx, "file:"+policiesPath, policystore.Options{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("coordinator %s: %w", id, err)
	}
	c, err := coord.StartProcess(context.WithoutCancel(ctx), coord.ProcessConfig{
		Region: regionName, Regions: regions, NATSURL: natsURL,
		NATSOptions: []nats.Option{nats.ReconnectWait(100 * time.Millisecond)},
		RedisAddrs:  redisAddrs, PolicySource: st, Knobs: knobs, LockTTL: lockTTL, ID: id, Logger: log,
	})
	if err != nil {
		st.Close()
		return nil, err
	}
	return &coordinator{Process: c, store: st}, nil
}

// stop ends the coordinator and closes its store. crash skips the lock's
// release.
func (c *coordinator) stop(crash bool) {
	if crash {
		c.Crash()
	} else {
		c.Stop()
	}
	c.store.Close()
}

// ActiveCoordinator is the index of the region's coordinator that holds
// the lock now, read from Redis, or -1 if none of its running ones does.
func (r *Region) ActiveCoordinator(ctx context.Context) (int, error) {
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: r.RedisAddrs})
	defer c.Close()
	id, err := c.Get(ctx, coord.LockKey(r.Name)).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return -1, fmt.Errorf("sandbox: %s coordinator lock: %w", r.Name, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, co := range r.coords {
		if co != nil && co.ID() == id {
			return i, nil
		}
	}
	return -1, nil
}
