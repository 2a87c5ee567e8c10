package region

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// reloadState asks a cluster client to reload its slot map after a shard
// failure (a failed round trip, a stall or a failed probe): the shard's
// master may have died and a replica been promoted in its place. go-redis
// reloads the map on MOVED and every ClusterStateReloadInterval (60 s),
// but not when a pipeline cannot reach a node, so without this a store
// keeps calling a dead master's address, its breaker probing in vain,
// for up to a minute after the promotion. The reload is asynchronous and
// coalesced by go-redis (at most one at a time, 200 ms apart), so a burst
// of failures costs one CLUSTER SLOTS, not one per call.
func (s *Store) reloadState() {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}
