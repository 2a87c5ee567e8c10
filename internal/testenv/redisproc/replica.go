package redisproc

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// AddReplica makes the running, empty cluster-mode server at replica a
// replica of the cluster master at master: the replica meets the cluster
// through master and is told CLUSTER REPLICATE; AddReplica returns once
// its copy is in sync (WaitInSync) and every node knows it as master's
// replica. It first sets
// master's repl-diskless-sync-delay to 0, so that the full sync starts at
// once instead of after the default 5 s wait for more replicas.
func AddReplica(ctx context.Context, master, replica string) error {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	m, r := clients(master, replica)
	defer m.Close()
	defer r.Close()

	if err := m.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		return fmt.Errorf("redisproc: %s: CONFIG SET repl-diskless-sync-delay: %w", master, err)
	}
	id, err := m.ClusterMyID(ctx).Result()
	if err != nil {
		return fmt.Errorf("redisproc: %s: CLUSTER MYID: %w", master, err)
	}
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		return fmt.Errorf("redisproc: master address %q: %w", master, err)
	}
	bus, err := busPort(ctx, m)
	if err != nil {
		return fmt.Errorf("redisproc: %s: %w", master, err)
	}
	// MEET with the bus port: Start may have chosen one other than
	// port+10000, which is all MEET assumes without it.
	if err := r.Do(ctx, "CLUSTER", "MEET", host, port, bus).Err(); err != nil {
		return fmt.Errorf("redisproc: %s: CLUSTER MEET %s: %w", replica, master, err)
	}
	// CLUSTER REPLICATE needs the handshake done (the replica knows master
	// by its id, as a master); gossip then tells it of the other nodes.
	if err := poll(ctx, func() (bool, string, error) {
		nodes, err := r.ClusterNodes(ctx).Result()
		if err != nil {
			return false, "", err
		}
		for _, n := range ParseClusterNodes(nodes) {
			if n.ID == id && n.Has("master") && !n.Has("handshake") {
				return true, "", nil
			}
		}
		return false, nodes, nil
	}); err != nil {
		return fmt.Errorf("redisproc: %s does not know master %s (%s): %w", replica, master, id, err)
	}
	if err := r.ClusterReplicate(ctx, id).Err(); err != nil {
		return fmt.Errorf("redisproc: %s: CLUSTER REPLICATE %s: %w", replica, id, err)
	}
	if err := WaitInSync(ctx, master, replica); err != nil {
		return err
	}
	// Every node must know the replica as master's replica, and the
	// replica every node and slot: a node that does not know the replica
	// ignores its claim to the slots when it is promoted (and keeps
	// pointing clients at the old master).
	rid, err := r.ClusterMyID(ctx).Result()
	if err != nil {
		return fmt.Errorf("redisproc: %s: CLUSTER MYID: %w", replica, err)
	}
	nodes, err := m.ClusterNodes(ctx).Result()
	if err != nil {
		return fmt.Errorf("redisproc: %s: CLUSTER NODES: %w", master, err)
	}
	for _, n := range ParseClusterNodes(nodes) {
		if n.ID == rid {
			continue
		}
		if err := waitKnowsReplica(ctx, n.Addr, rid, id); err != nil {
			return fmt.Errorf("redisproc: node %s does not know replica %s of %s: %w", n.Addr, replica, master, err)
		}
	}
	if err := poll(ctx, func() (bool, string, error) {
		mi, err := m.ClusterInfo(ctx).Result()
		if err != nil {
			return false, "", err
		}
		ri, err := r.ClusterInfo(ctx).Result()
		if err != nil {
			return false, "", err
		}
		ok := strings.Contains(ri, "cluster_state:ok") &&
			infoField(ri, "cluster_known_nodes") == infoField(mi, "cluster_known_nodes")
		return ok, "replica: " + ri, nil
	}); err != nil {
		return fmt.Errorf("redisproc: replica %s does not see the whole cluster: %w", replica, err)
	}
	return nil
}

// waitKnowsReplica polls the node at addr until its CLUSTER NODES lists
// the node replicaID as a replica of masterID.
func waitKnowsReplica(ctx context.Context, addr, replicaID, masterID string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	return poll(ctx, func() (bool, string, error) {
		nodes, err := c.ClusterNodes(ctx).Result()
		if err != nil {
			return false, "", err
		}
		for _, n := range ParseClusterNodes(nodes) {
			if n.ID == replicaID {
				return n.Has("slave") && n.MasterID == masterID, nodes, nil
			}
		}
		return false, nodes, nil
	})
}

// WaitInSync polls until replica's link to master is up and it has
// processed every byte master has written to its replication stream
// (replica's slave_repl_offset equals master's master_repl_offset): every
// write master acknowledged before the call is on the replica.
func WaitInSync(ctx context.Context, master, replica string) error {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	m, r := clients(master, replica)
	defer m.Close()
	defer r.Close()
	if err := poll(ctx, func() (bool, string, error) {
		mi, err := m.Info(ctx, "replication").Result()
		if err != nil {
			return false, "", err
		}
		ri, err := r.Info(ctx, "replication").Result()
		if err != nil {
			return false, "", err
		}
		want := infoField(mi, "master_repl_offset")
		ok := infoField(ri, "role") == "slave" && infoField(ri, "master_link_status") == "up" &&
			want != "" && infoField(ri, "slave_repl_offset") == want
		return ok, fmt.Sprintf("master offset %s; replica: %s", want, strings.Join(strings.Fields(ri), " ")), nil
	}); err != nil {
		return fmt.Errorf("redisproc: replica %s not in sync with %s: %w", replica, master, err)
	}
	return nil
}

// Takeover promotes the cluster replica at addr with CLUSTER FAILOVER
// TAKEOVER, which needs neither its master nor a majority of masters (so
// it works with its master dead and is deterministic), and returns once
// it reports role master. The other nodes learn the new configuration by
// gossip shortly after.
func Takeover(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, StartTimeout)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	if err := c.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		return fmt.Errorf("redisproc: %s: CLUSTER FAILOVER TAKEOVER: %w", addr, err)
	}
	if err := poll(ctx, func() (bool, string, error) {
		role, err := c.Do(ctx, "ROLE").Slice()
		if err != nil {
			return false, "", err
		}
		return len(role) > 0 && role[0] == "master", fmt.Sprint(role), nil
	}); err != nil {
		return fmt.Errorf("redisproc: %s not promoted: %w", addr, err)
	}
	return nil
}

// poll calls cond every pollInterval until it reports done or ctx ends;
// the error then carries cond's last error or state.
func poll(ctx context.Context, cond func() (done bool, state string, err error)) error {
	for {
		done, state, err := cond()
		if err == nil && done {
			return nil
		}
		if err != nil {
			state = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %s)", ctx.Err(), strings.TrimSpace(state))
		case <-time.After(pollInterval):
		}
	}
}

// infoField is the value of field in an INFO or CLUSTER INFO reply, or "".
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// clients returns one plain client for each of master and replica.
func clients(master, replica string) (m, r *redis.Client) {
	return redis.NewClient(&redis.Options{Addr: master, MaxRetries: -1, Protocol: 2}),
		redis.NewClient(&redis.Options{Addr: replica, MaxRetries: -1, Protocol: 2})
}

// busPort is a cluster node's bus port, read from its own line ("myself")
// of CLUSTER NODES.
func busPort(ctx context.Context, c *redis.Client) (string, error) {
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return "", fmt.Errorf("CLUSTER NODES: %w", err)
	}
	for _, n := range ParseClusterNodes(nodes) {
		if n.Has("myself") && n.Bus != "" {
			return n.Bus, nil
		}
	}
	return "", fmt.Errorf("no bus port in CLUSTER NODES: %q", nodes)
}
