// Package natsproc starts embedded nats-servers in this process: a single
// JetStream server or a supercluster of one server per region (each its
// own cluster block, joined by gateways). It is what the test helper
// natstest and the local sandbox share. It owns the servers it starts:
// Close shuts every one down and waits for it.
package natsproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ReadyTimeout bounds the wait for a server, its JetStream and the
// gateways, when the caller's context has no earlier deadline.
const ReadyTimeout = 15 * time.Second

// pollInterval is the pause between readiness probes.
const pollInterval = 20 * time.Millisecond

// StartJetStream starts a JetStream-enabled server on a random loopback
// port with its store in storeDir and returns once JetStream answers. The
// caller shuts it down (Shutdown, WaitForShutdown).
func StartJetStream(ctx context.Context, storeDir string) (*server.Server, error) {
	s, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
	})
	if err != nil {
		return nil, fmt.Errorf("natsproc: new server: %w", err)
	}
	s.Start() // does not block; the server's goroutines end with Shutdown
	stop := func() { s.Shutdown(); s.WaitForShutdown() }
	if !s.ReadyForConnections(ReadyTimeout) {
		stop()
		return nil, fmt.Errorf("natsproc: server not ready after %v", ReadyTimeout)
	}
	if err := WaitJetStream(ctx, s.ClientURL()); err != nil {
		stop()
		return nil, err
	}
	return s, nil
}

// WaitJetStream polls url until JetStream answers an account-info
// request, or ctx (bounded by ReadyTimeout) ends.
func WaitJetStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("natsproc: connect %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("natsproc: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsproc: JetStream not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(pollInterval):
		}
	}
}

// Supercluster is one nats-server per region, each with its own cluster
// block (a cluster of one, named for the region) and gateways to every
// other region: NATS as it is deployed across regions. Ports are fixed at
// creation, so a region can be stopped and restarted in place to cut it
// off and heal it.
type Supercluster struct {
	regions []string

	mu      sync.Mutex
	opts    map[string]*server.Options
	servers map[string]*server.Server
}

// RegionPorts are the ports of one region's server.
type RegionPorts struct {
	Client, Cluster, Gateway int
}

// GatewayRouting lets a caller put something (a fault-injecting proxy in
// tests) between the regions' gateways. The zero value dials the gateway
// ports directly.
type GatewayRouting struct {
	// Addr, when set, is the host:port that region from dials to reach
	// region to's gateway, which listens on 127.0.0.1:port.
	Addr func(from, to string, port int) string
	// Advertise, when set, is the gateway address every server advertises.
	// Servers gossip it to each other and add it to the URLs they dial
	// for that region, next to the configured one: with Addr routing
	// through proxies, an address that refuses connections keeps a
	// reconnect from going around them.
	Advertise string
}

// StartSupercluster starts one server per region, gateways between all
// of them, and returns once every server has an outbound gateway to
// every other region. On error nothing is left running.
func StartSupercluster(ctx context.Context, regions ...string) (*Supercluster, error) {
	return StartSuperclusterRouted(ctx, GatewayRouting{}, regions...)
}

// StartSuperclusterRouted is StartSupercluster with the gateway links
// routed as rt says.
func StartSuperclusterRouted(ctx context.Context, rt GatewayRouting, regions ...string) (*Supercluster, error) {
	if len(regions) == 0 {
		return nil, errors.New("natsproc: no region")
	}
	// A reserved port is free again once reserved: another process's
	// listener or outgoing connection may take it before the server binds
	// it, and that server then never gets ready. Start again on new ports.
	var errs []error
	for range 3 {
		sc, err := startSupercluster(ctx, rt, regions)
		if err == nil {
			return sc, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func startSupercluster(ctx context.Context, rt GatewayRouting, regions []string) (*Supercluster, error) {
	sc := &Supercluster{regions: regions, opts: map[string]*server.Options{}, servers: map[string]*server.Server{}}
	gw := map[string]int{}
	// All ports in one go: ports reserved by separate calls may repeat.
	all, err := freePorts(3 * len(regions))
	if err != nil {
		return nil, err
	}
	for i, r := range regions {
		ports := all[3*i : 3*i+3]
		gw[r] = ports[2]
		sc.opts[r] = &server.Options{
			ServerName: r,
			Host:       "127.0.0.1",
			Port:       ports[0],
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: r, Host: "127.0.0.1", Port: ports[1]},
			Gateway:    server.GatewayOpts{Name: r, Host: "127.0.0.1", Port: ports[2], ConnectRetries: -1, Advertise: rt.Advertise},
		}
	}
	for _, r := range regions {
		for _, o := range regions {
			if o != r {
				addr := fmt.Sprintf("127.0.0.1:%d", gw[o])
				if rt.Addr != nil {
					addr = rt.Addr(r, o, gw[o])
				}
				u := &url.URL{Scheme: "nats", Host: addr}
				sc.opts[r].Gateway.Gateways = append(sc.opts[r].Gateway.Gateways, &server.RemoteGatewayOpts{Name: o, URLs: []*url.URL{u}})
			}
		}
	}
	for _, r := range regions {
		if err := sc.Restart(r); err != nil {
			sc.Close()
			return nil, err
		}
	}
	if err := sc.WaitGateways(ctx); err != nil {
		sc.Close()
		return nil, err
	}
	return sc, nil
}

// Regions are the region names, in creation order.
func (sc *Supercluster) Regions() []string { return sc.regions }

// URL is the client URL of region's server.
func (sc *Supercluster) URL(region string) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", sc.Ports(region).Client)
}

// Ports are region's client, cluster and gateway ports.
func (sc *Supercluster) Ports(region string) RegionPorts {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	o := sc.opts[region]
	return RegionPorts{Client: o.Port, Cluster: o.Cluster.Port, Gateway: o.Gateway.Port}
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
func (sc *Supercluster) Restart(region string) error {
	sc.Stop(region)
	sc.mu.Lock()
	o := *sc.opts[region] // the server keeps and mutates its options
	sc.mu.Unlock()
	s, err := server.NewServer(&o)
	if err != nil {
		return fmt.Errorf("natsproc: %s: new server: %w", region, err)
	}
	s.Start()
	if !s.ReadyForConnections(ReadyTimeout) {
		s.Shutdown()
		s.WaitForShutdown()
		return fmt.Errorf("natsproc: %s not ready after %v", region, ReadyTimeout)
	}
	sc.mu.Lock()
	sc.servers[region] = s
	sc.mu.Unlock()
	return nil
}

// WaitGateways polls until every running server has an outbound gateway
// to every other running region, or ctx (bounded by ReadyTimeout) ends.
func (sc *Supercluster) WaitGateways(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
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
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natsproc: gateways not connected: %w", ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// Close shuts every server down and waits for them.
func (sc *Supercluster) Close() {
	for _, r := range sc.regions {
		sc.Stop(r)
	}
}

// freePorts reserves n distinct free loopback ports (another process may
// take one before the server binds it; starts then fail loudly, not hang).
func freePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("natsproc: free port: %w", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}
