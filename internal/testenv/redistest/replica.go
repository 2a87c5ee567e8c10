package redistest

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/testenv/redisproc"
)

// ClusterNodes is Cluster returning the masters' Instances, for tests that
// kill, pause or replicate one of them.
func ClusterNodes(t testing.TB, masters int) []*Instance {
	t.Helper()
	Require(t)
	requireBinary(t, "redis-cli")
	if masters < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	nodes := make([]*Instance, masters)
	addrs := make([]string, masters)
	for i := range nodes {
		dir := t.TempDir()
		nodes[i] = start(t, dir, redisproc.ClusterArgs(dir)...)
		addrs[i] = nodes[i].Addr
	}
	if err := redisproc.CreateCluster(context.Background(), addrs); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return nodes
}

// Replica starts a cluster-mode redis-server and makes it a replica of
// master (a node of a cluster from ClusterNodes), returning once it knows
// the whole cluster and holds master's data (WaitInSync). It is killed
// when the test ends.
func Replica(t testing.TB, master *Instance) *Instance {
	t.Helper()
	dir := t.TempDir()
	r := start(t, dir, redisproc.ClusterArgs(dir)...)
	if err := redisproc.AddReplica(context.Background(), master.Addr, r.Addr); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return r
}

// WaitInSync returns once replica has applied every write master
// acknowledged so far (polling replication offsets).
func WaitInSync(t testing.TB, master, replica *Instance) {
	t.Helper()
	if err := redisproc.WaitInSync(context.Background(), master.Addr, replica.Addr); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Takeover promotes a cluster replica with CLUSTER FAILOVER TAKEOVER (no
// vote: it works with its master dead) and returns once it reports role
// master.
func (in *Instance) Takeover() {
	in.t.Helper()
	if err := redisproc.Takeover(context.Background(), in.Addr); err != nil {
		in.t.Fatalf("redistest: %v", err)
	}
}
