// Package sandbox runs Allot's multi-region topology in one process on one
// machine: per region a Redis Cluster of real redis-server processes (or
// one server), an embedded NATS server with its own cluster block and
// gateways to the other regions, coordinators and nodes, with the given
// policies loaded. It is what `make sandbox` (cmd/allot-sandbox) and the
// chaos suite start. It owns every process and goroutine it starts: Stop
// tears all of them down, and on Linux a redis-server whose parent died
// is killed by the kernel, so nothing outlives the sandbox.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/node"
	"github.com/allot-dev/allot/internal/testenv/natsproc"
	"github.com/allot-dev/allot/internal/testenv/redisproc"
	"github.com/allot-dev/allot/lease"
)

// Config describes a sandbox. Zero fields take the defaults noted.
type Config struct {
	// Regions are the region names; default us, eu, ap.
	Regions []string
	// Policies is the policy file (required), e.g.
	// examples/sandbox-policies.yaml.
	Policies string
	// Dir holds the Redis logs and the derived policy files; empty makes
	// a temporary directory that Stop removes.
	Dir string
	// Masters is the number of redis-servers per region: 3 or more make a
	// Redis Cluster, 1 a single server. Default 3.
	Masters int
	// Nodes per region; default 2.
	Nodes int
	// Standby starts a second coordinator per region that takes over
	// through the Redis lock when the active one dies.
	Standby bool
	// Interval is the coordinators' rebalance interval; default 2 s (the
	// production default is 10 s; a sandbox wants to show changes soon).
	Interval time.Duration
	// LockTTL is the coordinators' lock TTL; default 2 s.
	LockTTL time.Duration
	// Lease holds the nodes' default lease knobs.
	Lease lease.Config
	// RedisProxy, when set, is the chaos seam for node→Redis links: it is
	// called with each redis-server's real address before it starts and
	// returns the address every client must use instead (a fault proxy to
	// target). Cluster masters announce that address, so the cluster's
	// own redirections go through the proxy too.
	RedisProxy func(region string, shard int, target string) (string, error)
	// GatewayProxy, when set, is the chaos seam for the NATS gateway
	// links: it is called for each link, from the dialing region to the
	// dialed one, with the dialed region's gateway address, and returns
	// the address the dialing server must use instead (a fault proxy to
	// target). The servers then advertise a gateway address that refuses
	// connections, so a gossiped URL cannot take a reconnect around the
	// proxies. Clients keep their direct link to their region's server.
	GatewayProxy func(from, to, target string) (string, error)
	// RedisCPUs, when set, are the only CPUs the redis-servers run on
	// (redisproc.Options.CPUs): with redisproc.PinRedis, a CPU of their
	// own, while the nodes, coordinators and NATS servers (this
	// process) run on the others, as with Redis hosts of their own.
	RedisCPUs []int
	// Logger receives the components' logs; nil discards them.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if len(c.Regions) == 0 {
		c.Regions = []string{"us", "eu", "ap"}
	}
	if c.Masters <= 0 {
		c.Masters = 3
	}
	if c.Nodes <= 0 {
		c.Nodes = 2
	}
	if c.Interval <= 0 {
		c.Interval = 2 * time.Second
	}
	if c.LockTTL <= 0 {
		c.LockTTL = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Sandbox is a running topology. Stop ends it.
type Sandbox struct {
	cfg     Config
	dir     string
	ownDir  bool
	nats    *natsproc.Supercluster
	regions []*Region
	started time.Duration
}

// Region is one region of a sandbox.
type Region struct {
	Name string
	// Redis are the region's redis-server processes (cluster masters).
	Redis []*redisproc.Server
	// RedisAddrs are the addresses clients use: the servers' own, or the
	// proxies' when Config.RedisProxy is set.
	RedisAddrs []string
	// NATSURL is the client URL of the region's NATS server.
	NATSURL string

	sb       *Sandbox
	policies string // the policy file nodes and coordinators read

	mu     sync.Mutex
	nodes  []*node.Node
	addrs  []string // gRPC address of node i, kept across restarts
	https  []string // HTTP address of node i
	coords []*coordinator
}

// Start brings the whole topology up and returns once every component
// answers. On error everything already started is stopped.
func Start(ctx context.Context, cfg Config) (_ *Sandbox, err error) {
	cfg.defaults()
	if cfg.Policies == "" {
		return nil, errors.New("sandbox: Config.Policies is required")
	}
	if _, err := os.Stat(cfg.Policies); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	abs, err := filepath.Abs(cfg.Policies)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	cfg.Policies = abs
	t0 := time.Now()
	sb := &Sandbox{cfg: cfg, dir: cfg.Dir}
	if sb.dir == "" {
		if sb.dir, err = os.MkdirTemp("", "allot-sandbox-"); err != nil {
			return nil, fmt.Errorf("sandbox: %w", err)
		}
		sb.ownDir = true
	}
	// sb is not the named result: every "return nil, err" below would
	// otherwise nil it before this runs.
	defer func() {
		if err != nil {
			err = errors.Join(err, sb.Stop())
		}
	}()
	if sb.nats, err = startNATS(ctx, cfg); err != nil {
		return nil, err
	}
	for _, name := range cfg.Regions {
		r := &Region{Name: name, NATSURL: sb.nats.URL(name), sb: sb}
		sb.regions = append(sb.regions, r)
		if err := r.startRedis(ctx); err != nil {
			return nil, err
		}
		// Nodes and coordinators read one file; nodes enforce L/n of its
		// global limits until their coordinator writes a share.
		r.policies = cfg.Policies
	}
	for _, r := range sb.regions {
		coords := 1
		if cfg.Standby {
			coords = 2
		}
		for i := range coords {
			if err := r.StartCoordinator(ctx, i); err != nil {
				return nil, err
			}
		}
		for i := range cfg.Nodes {
			if err := r.startNode(ctx, i, "127.0.0.1:0", "127.0.0.1:0"); err != nil {
				return nil, err
			}
		}
	}
	sb.started = time.Since(t0)
	return sb, nil
}

func (r *Region) startRedis(ctx context.Context) error {
	cfg := r.sb.cfg
	for i := range cfg.Masters {
		dir := filepath.Join(r.sb.dir, fmt.Sprintf("redis-%s-%d", r.Name, i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
		o := redisproc.Options{Dir: dir, CPUs: cfg.RedisCPUs}
		if cfg.Masters > 1 {
			o.Args = redisproc.ClusterArgs(dir)
		}
		client := ""
		if cfg.RedisProxy != nil {
			// The proxy must exist before the server starts, since a
			// cluster master announces the proxy's address.
			port, err := redisproc.FreePort()
			if err != nil {
				return err
			}
			o.Port = port
			target := "127.0.0.1:" + strconv.Itoa(port)
			if client, err = cfg.RedisProxy(r.Name, i, target); err != nil {
				return fmt.Errorf("sandbox: redis proxy for %s: %w", target, err)
			}
			if cfg.Masters > 1 {
				announce, err := announceArgs(client)
				if err != nil {
					return err
				}
				o.Args = append(o.Args, announce...)
			}
		}
		srv, err := redisproc.Start(ctx, o)
		if err != nil {
			return fmt.Errorf("sandbox: region %s: %w", r.Name, err)
		}
		if client == "" {
			client = srv.Addr
		}
		r.Redis = append(r.Redis, srv)
		r.RedisAddrs = append(r.RedisAddrs, client)
	}
	if cfg.Masters > 1 {
		addrs := make([]string, len(r.Redis))
		for i, s := range r.Redis {
			addrs[i] = s.Addr
		}
		if err := redisproc.CreateCluster(ctx, addrs); err != nil {
			return fmt.Errorf("sandbox: region %s: %w", r.Name, err)
		}
	}
	return nil
}

// announceArgs make a cluster master tell clients to reach it at the
// proxy's address, while the cluster bus stays direct, on a free port of
// its own that the master announces too.
func announceArgs(proxy string) ([]string, error) {
	_, p, _ := splitHostPort(proxy)
	bus, err := redisproc.FreePort()
	if err != nil {
		return nil, err
	}
	return []string{
		"--cluster-announce-ip", "127.0.0.1",
		"--cluster-announce-port", p,
		"--cluster-port", strconv.Itoa(bus),
		"--cluster-announce-bus-port", strconv.Itoa(bus),
	}, nil
}

// refusedGateway is the gateway address servers advertise when their
// links go through Config.GatewayProxy: nothing listens on port 1, so a
// dial is refused at once and the server tries its next URL, the proxy.
const refusedGateway = "127.0.0.1:1"

// startNATS starts the supercluster, its gateway links routed through
// cfg.GatewayProxy when set.
func startNATS(ctx context.Context, cfg Config) (*natsproc.Supercluster, error) {
	var rt natsproc.GatewayRouting
	var proxyErr error
	if cfg.GatewayProxy != nil {
		rt.Advertise = refusedGateway
		rt.Addr = func(from, to string, port int) string {
			target := "127.0.0.1:" + strconv.Itoa(port)
			addr, err := cfg.GatewayProxy(from, to, target)
			if err != nil {
				proxyErr = errors.Join(proxyErr, fmt.Errorf("sandbox: gateway proxy %s→%s: %w", from, to, err))
				return target
			}
			return addr
		}
	}
	// rt.Addr runs while the servers' options are built; a proxy error
	// is reported once the start returns.
	sc, err := natsproc.StartSuperclusterRouted(ctx, rt, cfg.Regions...)
	if err != nil {
		return nil, errors.Join(proxyErr, fmt.Errorf("sandbox: %w", err))
	}
	if proxyErr != nil {
		sc.Close()
		return nil, proxyErr
	}
	return sc, nil
}

// StartCoordinator starts coordinator i of the region. With a standby,
// whichever takes the region's lock first is active and the other waits
// (ActiveCoordinator says which).
func (r *Region) StartCoordinator(ctx context.Context, i int) error {
	cfg := r.sb.cfg
	knobs := coord.DefaultKnobs()
	knobs.Interval = cfg.Interval
	id := fmt.Sprintf("%s-coord-%d", r.Name, i)
	c, err := startCoordinator(ctx, id, r.Name, cfg.Regions, r.RedisAddrs, r.NATSURL, cfg.Policies, knobs, cfg.LockTTL, cfg.Logger.With("component", id))
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	r.mu.Lock()
	for len(r.coords) <= i {
		r.coords = append(r.coords, nil)
	}
	r.coords[i] = c
	r.mu.Unlock()
	return nil
}

// StopCoordinator stops coordinator i cleanly: it releases the region's
// lock if it holds it, so the standby takes over at its next attempt.
func (r *Region) StopCoordinator(i int) { r.endCoordinator(i, false) }

// CrashCoordinator kills coordinator i: it stops at once and does not
// release the lock, so the standby takes over only when the lock's TTL
// (Config.LockTTL) runs out, as after a killed process.
func (r *Region) CrashCoordinator(i int) { r.endCoordinator(i, true) }

func (r *Region) endCoordinator(i int, crash bool) {
	r.mu.Lock()
	var c *coordinator
	if i < len(r.coords) {
		c, r.coords[i] = r.coords[i], nil
	}
	r.mu.Unlock()
	if c != nil {
		c.stop(crash)
	}
}

// redisTimeout is the nodes' --redis-timeout. Every region's
// redis-servers share one CPU here, where a healthy one waits behind the
// others' scripts and the VM's own jitter (silences of up to 10 ms from
// one Redis alone; docs/performance.md, "Machine"); at the sandbox's
// capacity a 4 ms threshold judged such waits stalls. Production gives
// each Redis a host and runs the default (5 ms).
const redisTimeout = 25 * time.Millisecond

func (r *Region) startNode(ctx context.Context, i int, grpcAddr, httpAddr string) error {
	cfg := r.sb.cfg
	n, err := node.Start(ctx, node.Config{
		GRPCAddr:     grpcAddr,
		HTTPAddr:     httpAddr,
		Redis:        r.RedisAddrs,
		PoliciesPath: r.policies,
		Lease:        cfg.Lease,
		Logger:       cfg.Logger.With("component", fmt.Sprintf("%s-node-%d", r.Name, i)),
		Resilience:   node.Resilience{RedisTimeout: redisTimeout},
		MultiRegion: node.MultiRegion{
			Region: r.Name, Regions: cfg.Regions, NATSURL: r.NATSURL,
			Name: fmt.Sprintf("%s-node-%d", r.Name, i),
		},
	})
	if err != nil {
		return fmt.Errorf("sandbox: region %s node %d: %w", r.Name, i, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.nodes) <= i {
		r.nodes, r.addrs, r.https = append(r.nodes, nil), append(r.addrs, ""), append(r.https, "")
	}
	r.nodes[i], r.addrs[i], r.https[i] = n, n.Addr(), n.HTTPAddr()
	return nil
}

// NodeAddrs are the gRPC addresses of the region's nodes (stable across
// StopNode and StartNode).
func (r *Region) NodeAddrs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.addrs...)
}

// Node is node i, or nil while it is stopped.
func (r *Region) Node(i int) *node.Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nodes[i]
}

// StopNode stops node i gracefully, cutting its calls in flight after
// timeout (0: at once), and returns its unspent lease tokens to the
// region.
func (r *Region) StopNode(i int, timeout time.Duration) error {
	n := r.takeNode(i)
	if n == nil {
		return nil
	}
	if err := n.Close(timeout); err != nil {
		return fmt.Errorf("sandbox: stop %s node %d: %w", r.Name, i, err)
	}
	return nil
}

// CrashNode kills node i as a crashed process dies (node.Node.Crash):
// it stops serving at once and its unspent lease tokens are not
// returned, stranded in the region's buckets until their leases expire.
// It returns how many tokens were stranded. StartNode brings it back.
func (r *Region) CrashNode(i int) (stranded int64, err error) {
	n := r.takeNode(i)
	if n == nil {
		return 0, nil
	}
	if stranded, err = n.Crash(); err != nil {
		return stranded, fmt.Errorf("sandbox: crash %s node %d: %w", r.Name, i, err)
	}
	return stranded, nil
}

// takeNode marks node i stopped and returns it (nil if it was).
func (r *Region) takeNode(i int) *node.Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[i]
	r.nodes[i] = nil
	return n
}

// StartNode starts a stopped node i again on its previous addresses.
func (r *Region) StartNode(ctx context.Context, i int) error {
	r.mu.Lock()
	grpcAddr, httpAddr := r.addrs[i], r.https[i]
	running := r.nodes[i] != nil
	r.mu.Unlock()
	if running {
		return fmt.Errorf("sandbox: %s node %d is running", r.Name, i)
	}
	return r.startNode(ctx, i, grpcAddr, httpAddr)
}

// Regions are the sandbox's regions in Config order.
func (sb *Sandbox) Regions() []*Region { return sb.regions }

// Region is the region called name, or nil.
func (sb *Sandbox) Region(name string) *Region {
	for _, r := range sb.regions {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// NATS is the supercluster, to stop and restart a region's server, or to
// wait for its gateways.
func (sb *Sandbox) NATS() *natsproc.Supercluster { return sb.nats }

// StartupTime is how long Start took.
func (sb *Sandbox) StartupTime() time.Duration { return sb.started }

// Config is the sandbox's configuration, defaults applied.
func (sb *Sandbox) Config() Config { return sb.cfg }

// Stop tears everything down: nodes (returning their leases), then
// coordinators, Redis and NATS, and removes a temporary directory. Safe
// after a failed Start.
func (sb *Sandbox) Stop() error {
	var errs []error
	for _, r := range sb.regions {
		for i := range r.NodeAddrs() {
			errs = append(errs, r.StopNode(i, 2*time.Second))
		}
	}
	for _, r := range sb.regions {
		r.mu.Lock()
		n := len(r.coords)
		r.mu.Unlock()
		for i := range n {
			r.StopCoordinator(i)
		}
	}
	for _, r := range sb.regions {
		for _, s := range r.Redis {
			errs = append(errs, s.Kill())
		}
	}
	if sb.nats != nil {
		sb.nats.Close()
	}
	if sb.ownDir {
		errs = append(errs, os.RemoveAll(sb.dir))
	}
	return errors.Join(errs...)
}
