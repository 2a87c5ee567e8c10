package sweep

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/internal/tools/loadgen"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// readyTenant is the tenant of the checks that open a run's connections
// (dialReady): no key set has it (theirs are "t" and an index), so it
// takes no token that a measured request would.
const readyTenant = "sweep-ready"

// measure runs cfg (one target, closed loop) once the generator's own
// connections to the target have carried an answer (dialReady), and
// counts at least one measured answer. A run's clock starts when
// loadgen.Run begins, and gRPC connects lazily, on the first call: with
// the dial and the server's first decision inside a short window, a row
// on a starved machine could end before its first answer and measure
// nothing (issue 45). Answered first, the warm-up and the measured part
// are load only.
func measure(ctx context.Context, cfg loadgen.Config) (*loadgen.Report, error) {
	c, err := dialReady(ctx, cfg.Targets[0].Addr, cfg.Conns, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	return runOn(ctx, cfg, c)
}

// runOn runs cfg on c, a client dialReady returned, which it closes.
func runOn(ctx context.Context, cfg loadgen.Config, c loadgen.Checker) (*loadgen.Report, error) {
	handed := false
	cfg.Dial = func(loadgen.Target) (loadgen.Checker, error) {
		handed = true // Run closes it from now on
		return c, nil
	}
	cfg.MinMeasured = 1
	rep, err := loadgen.Run(ctx, cfg)
	if !handed {
		c.Close()
	}
	return rep, err
}

// dialReady dials addr over conns gRPC connections and returns once each
// has carried an answered check, retrying for up to readyTimeout. The
// client spreads calls over its connections in turn, so conns answers in
// a row have opened them all.
func dialReady(ctx context.Context, addr string, conns int, timeout time.Duration) (loadgen.Checker, error) {
	conns = max(conns, 1)
	c, err := loadgen.DialGRPC(addr, conns)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	req := &ratelimitv1.RateLimitRequest{TenantId: readyTenant}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for answered := 0; answered < conns; {
		cctx, ccancel := context.WithTimeout(ctx, timeout)
		_, err := c.Check(cctx, req)
		ccancel()
		if err == nil {
			answered++
			continue
		}
		answered = 0
		select {
		case <-ctx.Done():
			c.Close()
			return nil, fmt.Errorf("no answer from %s within %v: %w (last: %w)", addr, readyTimeout, ctx.Err(), err)
		case <-tick.C: // a server still starting refuses or fails calls: poll
		}
	}
	return c, nil
}
