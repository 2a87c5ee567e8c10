package node

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/allot-dev/allot/internal/rlqs"
	"github.com/allot-dev/allot/internal/server"
)

// startRLQS registers Envoy's Rate Limit Quota Service on the gRPC server:
// rate parts of the region buckets (internal/rlqs), settled through the
// region store, bucket ids keyed as the Envoy RLS face keys descriptors,
// counted and traced when the node has telemetry.
func (n *Node) startRLQS() error {
	cfg := rlqs.Config{Decider: n.decider, Keys: server.DefaultEnvoyKeys(), Log: n.perRequestLog(), Node: rlqsNodeName(n.lis.Addr().String())}
	if st := n.res.store; st != nil {
		cfg.Ledger = st
	}
	if tel := n.cfg.Telemetry; tel != nil {
		hook, stop, err := tel.ObserveRLQS(func() (int64, int64, int64) { return n.rlqs.Open() })
		if err != nil {
			return err
		}
		n.closers = append(n.closers, stop)
		cfg.Observe = func(ctx context.Context, ev rlqs.Event) { hook(ctx, ev.Kind, ev.PolicyID, ev.Rate) }
		if tel.Tracing() {
			cfg.Tracer = tel.Tracer()
		}
	}
	n.rlqs = rlqs.New(cfg)
	// Its settlements stop before the store closes.
	n.closers = append([]func() error{func() error { n.rlqs.Close(); return nil }}, n.closers...)
	rlqsv3.RegisterRateLimitQuotaServiceServer(n.grpc, n.rlqs)
	return nil
}

// rlqsNodeName names this node's record of parts in the region's Redis:
// its host and gRPC address, and a random suffix so that two nodes (or a
// node and its restart) never share a record.
func rlqsNodeName(addr string) string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%s/%x", host, addr, b)
}
