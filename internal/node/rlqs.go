package node

import (
	"context"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/allot-dev/allot/internal/rlqs"
	"github.com/allot-dev/allot/internal/server"
)

// startRLQS registers Envoy's Rate Limit Quota Service on the gRPC server:
// batches from the decider's leases (internal/rlqs), bucket ids keyed as
// the Envoy RLS face keys descriptors, counted and traced when the node
// has telemetry.
func (n *Node) startRLQS() error {
	cfg := rlqs.Config{Reserver: n.decider, Keys: server.DefaultEnvoyKeys(), Log: n.perRequestLog()}
	if tel := n.cfg.Telemetry; tel != nil {
		hook, stop, err := tel.ObserveRLQS(func() (int64, int64) { return n.rlqs.Open() })
		if err != nil {
			return err
		}
		n.closers = append(n.closers, stop)
		cfg.Observe = func(ctx context.Context, ev rlqs.Event) { hook(ctx, ev.Kind, ev.PolicyID, ev.Requests) }
		if tel.Tracing() {
			cfg.Tracer = tel.Tracer()
		}
	}
	n.rlqs = rlqs.New(cfg)
	rlqsv3.RegisterRateLimitQuotaServiceServer(n.grpc, n.rlqs)
	return nil
}
