package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/internal/tools/loadgen"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// regionChecker spreads a region's load over its nodes round-robin, and
// on an Unavailable answer (a node stopped or restarting) tries the next
// node once, as a client-side load balancer in front of the region would.
type regionChecker struct {
	nodes []loadgen.Checker
	next  atomic.Uint64
}

// DialRegion returns a loadgen.Checker for the region's nodes (for
// loadgen.Config.Dial). Connections survive node restarts, since a
// restarted node keeps its address.
func DialRegion(r *Region) (loadgen.Checker, error) {
	c := &regionChecker{}
	for _, a := range r.NodeAddrs() {
		n, err := loadgen.DialGRPC(a, 1)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("sandbox: dial %s: %w", a, err), c.Close())
		}
		c.nodes = append(c.nodes, n)
	}
	return c, nil
}

// Dial is a loadgen.Config.Dial for targets named after the regions.
func (sb *Sandbox) Dial(t loadgen.Target) (loadgen.Checker, error) {
	r := sb.Region(t.Region)
	if r == nil {
		return nil, fmt.Errorf("sandbox: no region %q", t.Region)
	}
	return DialRegion(r)
}

// Targets are one loadgen target per region (use with Dial).
func (sb *Sandbox) Targets() []loadgen.Target {
	var out []loadgen.Target
	for _, r := range sb.regions {
		out = append(out, loadgen.Target{Region: r.Name, Addr: r.NodeAddrs()[0]})
	}
	return out
}

func (c *regionChecker) Check(ctx context.Context, req *ratelimitv1.RateLimitRequest) (loadgen.Answer, error) {
	i := c.next.Add(1)
	d, err := c.nodes[i%uint64(len(c.nodes))].Check(ctx, req)
	if status.Code(err) == codes.Unavailable && len(c.nodes) > 1 {
		d, err = c.nodes[(i+1)%uint64(len(c.nodes))].Check(ctx, req)
	}
	return d, err
}

func (c *regionChecker) Close() error {
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
