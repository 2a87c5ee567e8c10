package redisproc

import (
	"slices"
	"strconv"
	"strings"
)

// ClusterNode is one line of CLUSTER NODES: "<id> <ip:port@bus[,hostname]>
// <flags> <master id or -> <ping> <pong> <epoch> <link> <slot>...".
type ClusterNode struct {
	ID       string
	Addr     string // ip:port
	Bus      string // the cluster bus port
	Flags    []string
	MasterID string   // "-" for a master
	Slots    []string // "a-b" ranges, single slots, and [..] migrations
}

// ParseClusterNodes reads a CLUSTER NODES reply; lines too short to be a
// node are skipped.
func ParseClusterNodes(reply string) []ClusterNode {
	var out []ClusterNode
	for line := range strings.SplitSeq(reply, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, bus, _ := strings.Cut(f[1], "@")
		bus, _, _ = strings.Cut(bus, ",")
		out = append(out, ClusterNode{ID: f[0], Addr: addr, Bus: bus, Flags: strings.Split(f[2], ","), MasterID: f[3], Slots: f[8:]})
	}
	return out
}

// Has reports whether the node carries flag (myself, master, slave,
// handshake, fail, ...).
func (n ClusterNode) Has(flag string) bool { return slices.Contains(n.Flags, flag) }

// Serves reports whether one of the node's slot ranges holds slot.
func (n ClusterNode) Serves(slot int64) bool {
	for _, rng := range n.Slots {
		lo, hi, isRange := strings.Cut(rng, "-")
		if !isRange {
			hi = lo
		}
		a, errA := strconv.ParseInt(lo, 10, 64)
		b, errB := strconv.ParseInt(hi, 10, 64)
		if errA == nil && errB == nil && a <= slot && slot <= b {
			return true
		}
	}
	return false
}
