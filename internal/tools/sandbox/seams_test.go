package sandbox_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/internal/tools/sandbox"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// The chaos suite's seams: ShardOf names the master that holds a key,
// GatewayProxy lets a region's gateway links be cut (both ways) while its
// clients stay connected, CrashNode kills a node that StartNode brings
// back, and CrashCoordinator kills the active coordinator without
// releasing its lock.
func TestChaosSeams(t *testing.T) {
	redistest.Require(t)
	ctx := context.Background()
	links := map[[2]string]*faultproxy.Proxy{}
	sb, err := sandbox.Start(ctx, sandbox.Config{
		Regions: []string{"us", "eu"}, Policies: "../../../examples/sandbox-policies.yaml", Nodes: 1, Standby: true,
		GatewayProxy: func(from, to, target string) (string, error) {
			p := natstest.GatewayProxy(t, from, target)
			links[[2]string{from, to}] = p
			return p.Addr, nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, sb.Stop()) })
	require.Len(t, links, 2)
	us, eu := sb.Region("us"), sb.Region("eu")

	t.Run("ShardOf", func(t *testing.T) {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: us.RedisAddrs})
		defer cc.Close()
		for _, key := range []string{"rl:{client=a}:p:l", "rl:{client=c3-0}:api-key-global:per_second", "x"} {
			require.NoError(t, cc.Set(ctx, key, "1", time.Minute).Err())
			i, err := us.ShardOf(ctx, key)
			require.NoError(t, err)
			c := redis.NewClient(&redis.Options{Addr: us.Redis[i].Addr})
			n, err := c.Exists(ctx, key).Result()
			c.Close()
			require.NoError(t, err, "shard %d of %s does not serve %q", i, us.Name, key)
			assert.Equal(t, int64(1), n, key)
		}
	})

	t.Run("GatewayCut", func(t *testing.T) {
		connect := func(r *sandbox.Region) *nats.Conn {
			nc, err := nats.Connect(r.NATSURL)
			require.NoError(t, err)
			t.Cleanup(nc.Close)
			return nc
		}
		usPub, usSub, euSub := connect(us), connect(us), connect(eu)
		local, err := usSub.SubscribeSync("seam")
		require.NoError(t, err)
		remote, err := euSub.SubscribeSync("seam")
		require.NoError(t, err)
		require.NoError(t, usSub.Flush())
		require.NoError(t, euSub.Flush())
		reaches := func(sub *nats.Subscription) bool {
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				require.NoError(t, usPub.Publish("seam", nil))
				if _, err := sub.NextMsg(100 * time.Millisecond); err == nil {
					return true
				}
			}
			return false
		}
		require.True(t, reaches(remote), "us → eu before the cut")
		for _, p := range links {
			p.Cut()
		}
		for { // drain what crossed before the cut
			if _, err := remote.NextMsg(300 * time.Millisecond); err != nil {
				break
			}
		}
		require.True(t, reaches(local), "us clients still reach their own server")
		_, err = remote.NextMsg(time.Second)
		require.ErrorIs(t, err, nats.ErrTimeout, "a message crossed the cut gateways")
		for _, p := range links {
			p.Heal()
		}
		require.NoError(t, sb.NATS().WaitGateways(ctx))
		require.True(t, reaches(remote), "us → eu after the heal")
	})

	t.Run("CrashNode", func(t *testing.T) {
		addr := us.NodeAddrs()[0]
		_, err := us.CrashNode(0)
		require.NoError(t, err)
		require.Nil(t, us.Node(0))
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Fatalf("crashed node %s still accepts connections", addr)
		}
		require.NoError(t, us.StartNode(ctx, 0))
		c, err := sandbox.DialRegion(us)
		require.NoError(t, err)
		defer c.Close()
		d, err := c.Check(ctx, &ratelimitv1.RateLimitRequest{ClientIdentifier: "k0"})
		require.NoError(t, err)
		require.Equal(t, ratelimitv1.RateLimitResponse_ALLOWED, d.Decision)
	})
	t.Run("CrashCoordinator", func(t *testing.T) {
		active := -1
		require.Eventually(t, func() bool {
			i, err := us.ActiveCoordinator(ctx)
			active = i
			return err == nil && i >= 0
		}, 10*time.Second, 50*time.Millisecond, "a coordinator holds the lock")
		us.CrashCoordinator(active)
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: us.RedisAddrs})
		defer cc.Close()
		id, err := cc.Get(ctx, "allot:coordinator:{us}").Result()
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("us-coord-%d", active), id, "a crashed coordinator does not release its lock")
		require.Eventually(t, func() bool {
			i, err := us.ActiveCoordinator(ctx)
			return err == nil && i == 1-active
		}, 10*time.Second, 50*time.Millisecond, "the standby takes over once the lock expires")
		require.NoError(t, us.StartCoordinator(ctx, active))
	})
}
