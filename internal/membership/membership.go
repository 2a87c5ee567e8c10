// Package membership tracks the live nodes of one region with
// hashicorp/memberlist (SWIM gossip), so that a node can size its
// local fallback bucket as limit / N while the region's Redis is
// unavailable.
//
// It owns the gossip listener and the count N; it must not decide
// anything (package fallback divides by N, through fallback.Sizer) and
// must never report fewer nodes than the configured floor: a node that
// is alone cannot tell "the others died" from "I am cut off from them",
// and assuming N = 1 would hand every node the whole limit (the Sentinel
// pitfall: a fallback that multiplies the limit by the real N).
package membership

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Config configures a node's membership.
type Config struct {
	// Name is this node's unique name in the region (default: host:port).
	Name string
	// BindAddr and BindPort are the gossip listener (TCP and UDP). Port 0
	// picks a free port; Addr reports it.
	BindAddr string
	BindPort int
	// AdvertiseAddr is the address other nodes reach this one on (default
	// BindAddr).
	AdvertiseAddr string
	// Seeds are gossip addresses of other nodes of the region.
	Seeds []string
	// Floor is the least N ever reported (default 2). Set it to the number
	// of nodes the region must keep even when this node sees none.
	Floor int
	// ProbeInterval is how often each node probes another (default
	// 500 ms); SuspicionMult scales how long a suspect stays suspect
	// before it is declared dead (default 4), and SuspicionMaxTimeoutMult
	// how much longer that can be without confirmations from other nodes
	// (default 2). FailureDetectionTime gives the resulting bound.
	ProbeInterval           time.Duration
	ProbeTimeout            time.Duration
	SuspicionMult           int
	SuspicionMaxTimeoutMult int
	Logger                  *slog.Logger
}

// DefaultFloor is Config.Floor's default.
const DefaultFloor = 2

func (c *Config) defaults() {
	if c.BindAddr == "" {
		c.BindAddr = "127.0.0.1"
	}
	if c.Floor <= 0 {
		c.Floor = DefaultFloor
	}
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = 500 * time.Millisecond
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = min(500*time.Millisecond, c.ProbeInterval/2)
	}
	if c.SuspicionMult <= 0 {
		c.SuspicionMult = 4
	}
	if c.SuspicionMaxTimeoutMult <= 0 {
		c.SuspicionMaxTimeoutMult = 2
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// FailureDetectionTime is the documented bound on how long a crashed node
// stays in N for a region of n nodes: one probe round to notice, the probe
// timeout, then the longest suspicion timeout memberlist may use,
// SuspicionMaxTimeoutMult x SuspicionMult x max(1, log10 n) x ProbeInterval
// (it is shorter when other nodes confirm the suspicion).
func (c Config) FailureDetectionTime(n int) time.Duration {
	c.defaults()
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	suspicion := time.Duration(float64(c.SuspicionMaxTimeoutMult*c.SuspicionMult) * scale * float64(c.ProbeInterval))
	return c.ProbeInterval + c.ProbeTimeout + suspicion
}

// Members is this node's view of its region. It is safe for concurrent
// use; N is a single atomic load.
type Members struct {
	cfg   Config
	ml    *memberlist.Memberlist
	n     atomic.Int64
	live  atomic.Int64
	mu    sync.Mutex
	nodes map[string]struct{}
	once  sync.Once
}

// Join starts gossip and joins the seeds (if any answers). A node whose
// seeds are all down still starts, alone, with N = Floor.
func Join(cfg Config) (*Members, error) {
	cfg.defaults()
	m := &Members{cfg: cfg, nodes: map[string]struct{}{}}
	m.n.Store(int64(cfg.Floor))
	mc := memberlist.DefaultLANConfig()
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertisePort = cfg.BindPort
	if cfg.AdvertiseAddr != "" {
		mc.AdvertiseAddr = cfg.AdvertiseAddr
	}
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.SuspicionMaxTimeoutMult = cfg.SuspicionMaxTimeoutMult
	mc.GossipInterval = min(mc.GossipInterval, cfg.ProbeInterval/2)
	mc.Events = events{m}
	mc.Logger = log.New(slogWriter{cfg.Logger}, "", 0)
	if cfg.Name != "" {
		mc.Name = cfg.Name
	} else {
		mc.Name = net.JoinHostPort(cfg.BindAddr, strconv.Itoa(cfg.BindPort)) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: start gossip on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	m.ml = ml
	if len(cfg.Seeds) > 0 {
		if _, err := ml.Join(cfg.Seeds); err != nil {
			cfg.Logger.Warn("membership: no seed answered; starting alone", "seeds", cfg.Seeds, "n", cfg.Floor, "err", err)
		}
	}
	return m, nil
}

// N is the node count to divide limits by: the live nodes this node sees
// (itself included), never less than the floor.
func (m *Members) N() int { return int(m.n.Load()) }

// Live is the number of live nodes seen, itself included.
func (m *Members) Live() int { return int(m.live.Load()) }

// Addr is the gossip address other nodes can use as a seed.
func (m *Members) Addr() string {
	n := m.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Leave tells the others this node is going (so they drop it at once
// rather than after failure detection) and stops gossip.
func (m *Members) Leave(timeout time.Duration) error {
	var err error
	m.once.Do(func() {
		err = errors.Join(m.ml.Leave(timeout), m.ml.Shutdown())
	})
	return err
}

// Crash stops gossip without a goodbye, as a killed process would. For
// tests of failure detection.
func (m *Members) Crash() error {
	var err error
	m.once.Do(func() { err = m.ml.Shutdown() })
	return err
}

func (m *Members) update(name string, alive bool) {
	m.mu.Lock()
	if alive {
		m.nodes[name] = struct{}{}
	} else {
		delete(m.nodes, name)
	}
	live := len(m.nodes)
	m.mu.Unlock()
	m.live.Store(int64(live))
	m.n.Store(int64(max(live, m.cfg.Floor)))
	m.cfg.Logger.Info("membership changed", "node", name, "alive", alive, "live", live, "n", m.N())
}

// events feeds memberlist's callbacks into Members. memberlist calls them
// with its own locks held, so they only touch Members' state.
type events struct{ m *Members }

func (e events) NotifyJoin(n *memberlist.Node)   { e.m.update(n.Name, true) }
func (e events) NotifyLeave(n *memberlist.Node)  { e.m.update(n.Name, false) }
func (e events) NotifyUpdate(n *memberlist.Node) {}

// slogWriter routes memberlist's log.Logger lines into slog at debug.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Debug("memberlist", "msg", string(trimNL(p)))
	return len(p), nil
}

func trimNL(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == '\n' || p[len(p)-1] == '\r') {
		p = p[:len(p)-1]
	}
	return p
}

var _ io.Writer = slogWriter{}
