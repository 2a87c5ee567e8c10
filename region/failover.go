package region

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// reloadOnShardFailure asks a cluster client to reload its slot map when
// a call it sent failed as a shard failure (shardFailure): the shard's
// master may have died and a replica been promoted in its place. go-redis
// reloads the map on MOVED and every ClusterStateReloadInterval (60 s),
// but not when a pipeline cannot reach a node, so without this a store
// keeps calling a dead master's address, its breaker probing in vain,
// for up to a minute after the promotion. The reload is asynchronous and
// coalesced by go-redis (at most one at a time, 200 ms apart), so a burst
// of failures costs one CLUSTER SLOTS, not one per call.
func (s *Store) reloadOnShardFailure(adm admission, cmds []*redis.Cmd) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	for i, c := range cmds {
		if adm.sent(i) && c != nil && shardFailure(c.Err()) {
			cc.ReloadState(context.Background())
			return
		}
	}
}
