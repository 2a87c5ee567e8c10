package natstest

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Supercluster is one nats-server per region, each with its own cluster
// block (a cluster of one, named for the region) and gateways to every
// other region: NATS as it is deployed across regions. Ports are fixed at
// creation, so a region can be stopped and restarted in place to cut it
// off and heal it.
type Supercluster struct {
	t       testing.TB
	regions []string

	mu      sync.Mutex
	opts    map[string]*server.Options
	servers map[string]*server.Server
}

// StartSupercluster starts one server per region, gateways between all of
// them, and returns once every server has an outbound gateway to every
// other region. Everything is shut down when the test ends.
func StartSupercluster(t testing.TB, regions ...string) *Supercluster {
	t.Helper()
	sc := &Supercluster{t: t, regions: regions, opts: map[string]*server.Options{}, servers: map[string]*server.Server{}}
	gw := map[string]int{}
	for _, r := range regions {
		ports := freePorts(t, 3)
		gw[r] = ports[2]
		sc.opts[r] = &server.Options{
			ServerName: r,
			Host:       "127.0.0.1",
			Port:       ports[0],
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: r, Host: "127.0.0.1", Port: ports[1]},
			Gateway:    server.GatewayOpts{Name: r, Host: "127.0.0.1", Port: ports[2], ConnectRetries: -1},
		}
	}
	for _, r := range regions {
		for _, o := range regions {
			if o != r {
				u := &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", gw[o])}
				sc.opts[r].Gateway.Gateways = append(sc.opts[r].Gateway.Gateways, &server.RemoteGatewayOpts{Name: o, URLs: []*url.URL{u}})
			}
		}
	}
	t.Cleanup(sc.shutdown)
	for _, r := range regions {
		sc.Restart(r)
	}
	sc.WaitGateways()
	return sc
}

// URL is the client URL of region's server.
func (sc *Supercluster) URL(region string) string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", sc.opts[region].Port)
}

// Stop shuts region's server down: its clients and its gateways are cut
// until Restart.
func (sc *Supercluster) Stop(region string) {
	sc.mu.Lock()
	s := sc.servers[region]
	delete(sc.servers, region)
	sc.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Restart starts region's server again on its ports (a running one is
// stopped first) and waits until it accepts clients.
func (sc *Supercluster) Restart(region string) {
	sc.t.Helper()
	sc.Stop(region)
	sc.mu.Lock()
	o := *sc.opts[region] // the server keeps and mutates its options
	sc.mu.Unlock()
	s, err := server.NewServer(&o)
	if err != nil {
		sc.t.Fatalf("natstest: %s: new server: %v", region, err)
	}
	s.Start()
	if !s.ReadyForConnections(readyTimeout) {
		s.Shutdown()
		sc.t.Fatalf("natstest: %s not ready after %v", region, readyTimeout)
	}
	sc.mu.Lock()
	sc.servers[region] = s
	sc.mu.Unlock()
}

// WaitGateways polls until every running server has an outbound gateway
// to every other running region.
func (sc *Supercluster) WaitGateways() {
	sc.t.Helper()
	deadline := time.Now().Add(readyTimeout)
	for {
		sc.mu.Lock()
		ok := true
		for _, s := range sc.servers {
			if s.NumOutboundGateways() != len(sc.servers)-1 {
				ok = false
			}
		}
		sc.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			sc.t.Fatalf("natstest: gateways not connected after %v", readyTimeout)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

func (sc *Supercluster) shutdown() {
	for _, r := range sc.regions {
		sc.Stop(r)
	}
}

// freePorts reserves n distinct free loopback ports (another process may
// take one before the server binds it; tests then fail loudly, not hang).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ls := make([]net.Listener, n)
	ports := make([]int, n)
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("natstest: free port: %v", err)
		}
		ls[i], ports[i] = l, l.Addr().(*net.TCPAddr).Port
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}
