package region_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// A return whose script ran but whose reply was lost (the connection broke
// in between) must not be sent again: run twice, it would credit its
// tokens twice. go-redis's cluster pipeline re-sends a batch after such a
// break unless the command says NoRetry.
func TestScriptWithLostReplyIsNotResent(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	const key = "rl:{resend}:x"
	addrs, master := clusterWithKey(t, key)
	masterAddr := master.Addr
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { probe.Close() })

	// The key's master announces a proxy in front of it, so that every
	// client reaches it through the proxy.
	p := faultproxy.New(t, masterAddr)
	_, mport, err := net.SplitHostPort(masterAddr)
	require.NoError(t, err)
	_, pport, err := net.SplitHostPort(p.Addr)
	require.NoError(t, err)
	mp, err := strconv.Atoi(mport)
	require.NoError(t, err)
	direct := redis.NewClient(&redis.Options{Addr: masterAddr})
	t.Cleanup(func() { direct.Close() })
	require.NoError(t, direct.ConfigSet(ctx, "cluster-announce-bus-port", strconv.Itoa(mp+10000)).Err())
	require.NoError(t, direct.ConfigSet(ctx, "cluster-announce-port", pport).Err())
	slot := int(probe.ClusterKeySlot(ctx, key).Val())
	require.Eventually(t, func() bool { // gossip spreads the new port: polling
		for _, a := range addrs {
			c := redis.NewClient(&redis.Options{Addr: a})
			shards, err := c.ClusterShards(ctx).Result()
			c.Close()
			if err != nil || !announces(shards, slot, pport) {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "the cluster never announced the proxy")

	st, err := region.Open(ctx, addrs, region.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	spec := tb(100, time.Hour, 0)
	now, err := direct.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, direct.HSet(ctx, key, "tokens", 50, "ts", now.UnixMicro()).Err())

	// A first return of nothing opens the pooled connection through the
	// proxy and loads the script, so the next call is one EVALSHA.
	_, err = st.Return(ctx, []lease.ReturnItem{{Key: key, Spec: spec, Unspent: 0}})
	require.NoError(t, err)
	p.DropReplies(true)
	rctx, cancel := context.WithTimeout(ctx, time.Second) // as the lease manager bounds a return
	defer cancel()
	_, err = st.Return(rctx, []lease.ReturnItem{{Key: key, Spec: spec, Unspent: 10}})
	p.DropReplies(false)
	require.Error(t, err, "the reply was dropped")
	got := bucket(t, direct, key).Tokens
	t.Logf("tokens after one return of 10 whose reply was lost: %.4f (50 before)", got)
	require.InDelta(t, 60, got, 0.5, "the return ran exactly once")
}

// announces reports whether the shard serving slot lists a node on port.
func announces(shards []redis.ClusterShard, slot int, port string) bool {
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if slot < int(r.Start) || slot > int(r.End) {
				continue
			}
			for _, n := range sh.Nodes {
				if strconv.FormatInt(n.Port, 10) == port && n.Role == "master" {
					return true
				}
			}
		}
	}
	return false
}
