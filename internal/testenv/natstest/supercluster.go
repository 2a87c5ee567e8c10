package natstest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/allot-dev/allot/internal/testenv/faultproxy"
	"github.com/allot-dev/allot/internal/testenv/natsproc"
)

// Supercluster is one nats-server per region, each with its own cluster
// block (a cluster of one, named for the region) and gateways to every
// other region: NATS as it is deployed across regions. Ports are fixed at
// creation, so a region can be stopped and restarted in place to cut it
// off and heal it.
type Supercluster struct {
	t  testing.TB
	sc *natsproc.Supercluster
	// proxies are the gateway links of StartSuperclusterProxied, by
	// (dialing region, dialed region); nil otherwise.
	proxies map[[2]string]*faultproxy.Proxy
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

// unreachableGateway is the gateway address the servers of
// StartSuperclusterProxied advertise: nothing listens on port 1, so a
// dial is refused at once and the server tries its next URL, the proxy.
const unreachableGateway = "127.0.0.1:1"

// StartSuperclusterProxied is StartSupercluster with every gateway
// connection going through a faultproxy, one per (dialing region, dialed
// region), so CutGateways can cut one region's gateway links while its
// server, and every client connected to it, stays up. The servers
// advertise an address that refuses connections (the gossiped gateway
// URLs would otherwise let a reconnect go around the proxies). Servers
// also gossip the URLs they dial for the other regions: so that another
// region cannot use a link's proxy, each proxy admits only the gateway
// whose CONNECT names the link's dialing region.
func StartSuperclusterProxied(t testing.TB, regions ...string) *Supercluster {
	t.Helper()
	proxies := map[[2]string]*faultproxy.Proxy{}
	rt := natsproc.GatewayRouting{
		Addr: func(from, to string, port int) string {
			p := GatewayProxy(t, from, fmt.Sprintf("127.0.0.1:%d", port))
			proxies[[2]string{from, to}] = p
			return p.Addr
		},
		Advertise: unreachableGateway,
	}
	sc, err := natsproc.StartSuperclusterRouted(context.Background(), rt, regions...)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	t.Cleanup(sc.Close) // runs before the proxies' cleanups
	return &Supercluster{t: t, sc: sc, proxies: proxies}
}

// GatewayProxy starts a faultproxy to target, the gateway address of
// another region, for the gateway link region from dials: it admits only
// a gateway whose CONNECT names from, so that no other region can use the
// link's proxy (servers gossip the URLs they dial). It stops with the
// test. StartSuperclusterProxied makes one per link; so does the
// sandbox's chaos suite (sandbox.Config.GatewayProxy).
func GatewayProxy(t testing.TB, from, target string) *faultproxy.Proxy {
	t.Helper()
	p := faultproxy.New(t, target)
	p.AdmitFirstLine(func(line []byte) bool { return gatewayConnectFrom(line) == from })
	return p
}

// gatewayConnectFrom is the gateway name in a gateway's CONNECT line
// ("CONNECT {...,"gateway":"eu",...}\r\n"), or "" for any other line.
func gatewayConnectFrom(line []byte) string {
	arg, ok := bytes.CutPrefix(line, []byte("CONNECT "))
	if !ok {
		return ""
	}
	var c struct {
		Gateway string `json:"gateway"`
	}
	if json.Unmarshal(bytes.TrimSpace(arg), &c) != nil {
		return ""
	}
	return c.Gateway
}

// CutGateways cuts every gateway link of region, both directions (its
// outbound connections to the other regions and theirs to it): open
// connections are reset and reconnects refused until HealGateways.
// Region's server and its clients stay up. Only for a supercluster
// started with StartSuperclusterProxied.
func (sc *Supercluster) CutGateways(region string) {
	sc.t.Helper()
	for _, p := range sc.links(region) {
		p.Cut()
	}
}

// HealGateways undoes CutGateways and waits until every server has an
// outbound gateway to every other region again.
func (sc *Supercluster) HealGateways(region string) {
	sc.t.Helper()
	for _, p := range sc.links(region) {
		p.Heal()
	}
	sc.WaitGateways()
}

// links are the proxies of region's gateway links in both directions.
func (sc *Supercluster) links(region string) []*faultproxy.Proxy {
	sc.t.Helper()
	if sc.proxies == nil {
		sc.t.Fatalf("natstest: gateway links of %s: supercluster not started with StartSuperclusterProxied", region)
	}
	var ps []*faultproxy.Proxy
	for _, o := range sc.sc.Regions() {
		if o != region {
			ps = append(ps, sc.proxies[[2]string{region, o}], sc.proxies[[2]string{o, region}])
		}
	}
	return ps
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
