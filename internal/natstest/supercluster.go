package natstest

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/internal/natsproc"
)

// Supercluster is one nats-server per region, each with its own cluster
// block (a cluster of one, named for the region) and gateways to every
// other region: NATS as it is deployed across regions. Ports are fixed at
// creation, so a region can be stopped and restarted in place to cut it
// off and heal it.
type Supercluster struct {
	t  testing.TB
	sc *natsproc.Supercluster
}

// StartSupercluster starts one server per region, gateways between all of
// them, and returns once every server has an outbound gateway to every
// other region. Everything is shut down when the test ends.
func StartSupercluster(t testing.TB, regions ...string) *Supercluster {
	t.Helper()
	sc, err := natsproc.StartSupercluster(context.Background(), regions...)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(sc.Close)
	return &Supercluster{t: t, sc: sc}
}

// URL is the client URL of region's server.
func (sc *Supercluster) URL(region string) string { return sc.sc.URL(region) }

// Stop shuts region's server down: its clients and its gateways are cut
// until Restart.
func (sc *Supercluster) Stop(region string) { sc.sc.Stop(region) }

// Restart starts region's server again on its ports (a running one is
// stopped first) and waits until it accepts clients.
func (sc *Supercluster) Restart(region string) {
	sc.t.Helper()
	if err := sc.sc.Restart(region); err != nil {
		sc.t.Fatalf("natstest: %v", err)
	}
}

// WaitGateways polls until every running server has an outbound gateway
// to every other running region.
func (sc *Supercluster) WaitGateways() {
	sc.t.Helper()
	if err := sc.sc.WaitGateways(context.Background()); err != nil {
		sc.t.Fatalf("natstest: %v", err)
	}
}
