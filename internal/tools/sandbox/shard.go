package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/internal/testenv/redisproc"
)

// ShardOf is the index (into Redis and RedisAddrs) of the region's master
// that serves key: its slot by CLUSTER KEYSLOT, then that slot's master
// by CLUSTER NODES, matched on the address it announces. A region of one
// server answers 0.
func (r *Region) ShardOf(ctx context.Context, key string) (int, error) {
	if len(r.Redis) == 1 {
		return 0, nil
	}
	var errs []error
	for _, s := range r.Redis { // the first server that answers
		i, err := r.shardOf(ctx, s.Addr, key)
		if err == nil {
			return i, nil
		}
		errs = append(errs, err)
	}
	return 0, fmt.Errorf("sandbox: %s shard of %q: %w", r.Name, key, errors.Join(errs...))
}

func (r *Region) shardOf(ctx context.Context, addr, key string) (int, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("CLUSTER KEYSLOT: %w", err)
	}
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("CLUSTER NODES: %w", err)
	}
	master, ok := masterOf(nodes, slot)
	if !ok {
		return 0, fmt.Errorf("slot %d: no master in CLUSTER NODES", slot)
	}
	for i, a := range r.RedisAddrs {
		if a == master {
			return i, nil
		}
	}
	return 0, fmt.Errorf("slot %d: master %s is not one of %v", slot, master, r.RedisAddrs)
}

// masterOf is the address of the master serving slot in a CLUSTER NODES
// reply.
func masterOf(nodes string, slot int64) (string, bool) {
	for _, n := range redisproc.ParseClusterNodes(nodes) {
		if n.Has("master") && n.Serves(slot) {
			return n.Addr, true
		}
	}
	return "", false
}
