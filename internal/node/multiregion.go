package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/internal/coord/demand"
)

// MultiRegion is a node's part in sharing `scope: global` limits between
// regions (ARCHITECTURE.md, "Multi-region").
type MultiRegion struct {
	// Region is this node's region; empty disables the multi-region part.
	Region string
	// Regions names every region sharing global limits, this one
	// included. Their number n makes a global limit enforce L/n here until
	// the coordinator writes this region's share into the bucket.
	Regions []string
	// NATSURL is this region's NATS cluster; the node publishes its
	// per-key demand there for the region's coordinator. Empty: no demand
	// is published (shares then stay at L/n).
	NATSURL string
	// DemandPeriod is how often demand is published (default 1 s); the
	// coordinator sees demand at most this late.
	DemandPeriod time.Duration
	// Name identifies the node in demand snapshots (default: the gRPC address).
	Name string
}

func (m *MultiRegion) validate() error {
	switch {
	case m.Region == "" && (len(m.Regions) > 0 || m.NATSURL != ""):
		return errors.New("multi-region: --regions and --nats need --region")
	case m.Region != "" && !slices.Contains(m.Regions, m.Region):
		return fmt.Errorf("multi-region: --regions %v must include this node's --region %q", m.Regions, m.Region)
	}
	return nil
}

// regions is the number of regions sharing global limits, for
// decide.Config.Regions: 0 without multi-region.
func (m *MultiRegion) regions() int {
	if m.Region == "" {
		return 0
	}
	return len(m.Regions)
}

// publishesDemand says whether startMultiRegion starts the demand
// publisher: a region, a NATS URL and a region store (the lease manager).
// The decider counts demand only then, since only it drains the counts.
func (n *Node) publishesDemand() bool {
	mr := n.cfg.MultiRegion
	return mr.Region != "" && mr.NATSURL != "" && n.leases != nil
}

// startMultiRegion starts the demand publisher. It runs after the decider
// (sized for the regions by Start) and the lease manager exist, on a
// validated MultiRegion.
func (n *Node) startMultiRegion() error {
	mr := n.cfg.MultiRegion
	if !n.publishesDemand() {
		if mr.Region != "" && mr.NATSURL != "" {
			// Standalone: no region buckets to share and no demand to drain.
			n.log.Warn("multi-region: --nats ignored in standalone mode (no --redis)")
		}
		return nil
	}
	nc, err := nats.Connect(mr.NATSURL, append([]nats.Option{nats.Name("allot-node " + mr.Region), nats.MaxReconnects(-1)}, n.cfg.Transport.NATS...)...)
	if err != nil {
		return fmt.Errorf("multi-region: connect to NATS %s: %w", mr.NATSURL, err)
	}
	name := mr.Name
	if name == "" {
		name = n.cfg.GRPCAddr
	}
	// Leased and exact global keys both feed the coordinator: rates for
	// shares, fixed windows for the quota exchange.
	drain := func(fn func(key string, admitted, denied int64)) {
		if n.leases != nil {
			n.leases.DrainDemand(fn)
		}
		n.decider.DrainDemand(fn)
	}
	pub := &demand.Publisher{NC: nc, Region: mr.Region, Node: name, Drain: drain, Period: mr.DemandPeriod, Log: n.log}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub.Run(ctx)
	}()
	// Closers run in order: stop publishing (with a last snapshot) before
	// the lease manager and Redis close.
	n.closers = append([]func() error{func() error {
		cancel()
		<-done
		err := nc.Drain()
		if errors.Is(err, nats.ErrConnectionClosed) {
			err = nil
		}
		return err
	}}, n.closers...)
	// A crash drops the connection first: no last snapshot goes out.
	n.crashHooks = append(n.crashHooks, nc.Close)
	n.log.Info("multi-region", "region", mr.Region, "regions", mr.Regions, "nats", mr.NATSURL)
	return nil
}
