// Package demand is the demand wire between a region's nodes and its
// coordinator: the node side (Publisher), the coordinator side
// (Collector) and their codec (coordv1.Demand snapshots, front-coded and
// chunked under the NATS max payload). Nodes import it without linking
// the coordinator.
//
// Demand, here and in every package that speaks of it (lease's and
// decide's DrainDemand, coord, rebalance.Demand): the tokens a global key
// was asked for in one region, admitted plus denied, that its nodes count
// and its coordinator turns into the per-key rate it reports to the other
// regions. An RLQS client's rate within a region bucket is its offered
// rate (internal/rlqs), not demand.
//
// demand owns the wire, not the counts: the nodes count (lease, decide),
// the coordinator drains and reports (coord). A node never waits for its
// coordinator: a snapshot NATS does not take is logged and lost, and the
// coordinator sees that much less demand.
package demand

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/frontcode"
	"github.com/allot-dev/allot/internal/ratelog"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// Prefix is the subject space of demand: nodes publish on
// allot.demand.<region>, which stays in its region (gateways carry only
// the coordinators' subjects).
const Prefix = "allot.demand."

// chunkOverhead is room left in every chunk for the message around the
// entries.
const chunkOverhead = 256

// DrainFunc is the shape of (*lease.Manager).DrainDemand: it calls fn once
// per key with the tokens admitted and denied since the previous call.
type DrainFunc func(fn func(key string, admitted, denied int64))

// Drain makes a DrainFunc (a lease.Manager's DrainDemand, in a process
// that runs node and coordinator together) a coordinator's demand source.
func (f DrainFunc) Drain(fn func(key string, admitted, denied int64)) { f(fn) }

// Subscribe subscribes fn to subject with room for bursts and returns
// once the server has the interest, so nothing published after it is
// missed. Reports (and demand snapshots) of 100,000 keys are a few MB per
// region and interval: the subscription buffers that much rather than
// drop it as slow.
func Subscribe(nc *nats.Conn, subject string, fn nats.MsgHandler) (*nats.Subscription, error) {
	sub, err := nc.Subscribe(subject, fn)
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subject, err)
	}
	if err := sub.SetPendingLimits(-1, 256<<20); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("pending limits of %s: %w", subject, err)
	}
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		return nil, fmt.Errorf("flush subscription to %s: %w", subject, err)
	}
	return sub, nil
}

// Collector sums the demand snapshots the region's nodes publish on
// allot.demand.<region>; the coordinator drains it every epoch.
type Collector struct {
	Sum
	log *slog.Logger
	sub *nats.Subscription
}

// Collect starts collecting region's demand from nc. Close ends it.
func Collect(nc *nats.Conn, region string, log *slog.Logger) (*Collector, error) {
	if log == nil {
		log = slog.Default()
	}
	// Snapshots may be forged or corrupt: the warnings about them are
	// rate-limited.
	c := &Collector{log: ratelog.New(log, ratelog.DefaultEvery, nil)}
	sub, err := Subscribe(nc, Prefix+region, c.receive)
	if err != nil {
		return nil, fmt.Errorf("demand: %w", err)
	}
	c.sub = sub
	return c, nil
}

func (c *Collector) receive(msg *nats.Msg) {
	if err := c.Add(msg.Data); err != nil {
		c.log.Warn("demand: dropping undecodable snapshot", "err", err)
	}
}

// Sum is the coordinator side of the wire without NATS: the sum of the
// snapshots added since the last Drain (a Collector adds what its
// subscription receives; the simulator, internal/tools/sim, what its
// nodes' snapshots bring). The zero Sum is empty and ready; it is safe
// for concurrent use, and a coordinator's DemandSource.
type Sum struct {
	mu  sync.Mutex
	sum map[string][2]int64
}

// Add decodes one snapshot as a node publishes it (Snapshots) and adds
// its entries (negative counts as 0).
func (s *Sum) Add(data []byte) error {
	var m coordv1.Demand
	if err := proto.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("demand: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sum == nil {
		s.sum = map[string][2]int64{}
	}
	return Decode(&m, func(key string, admitted, denied int64) {
		v := s.sum[key]
		s.sum[key] = [2]int64{v[0] + max(0, admitted), v[1] + max(0, denied)}
	})
}

// Drain calls fn with every key's admitted and denied tokens since the
// previous Drain.
func (s *Sum) Drain(fn func(key string, admitted, denied int64)) {
	s.mu.Lock()
	sum := s.sum
	s.sum = make(map[string][2]int64, len(sum))
	s.mu.Unlock()
	for k, v := range sum {
		fn(k, v[0], v[1])
	}
}

// Close stops collecting.
func (c *Collector) Close() error {
	if err := c.sub.Unsubscribe(); err != nil {
		return fmt.Errorf("demand: unsubscribe: %w", err)
	}
	return nil
}

// Publisher is the node side: every Period it drains a DrainFunc and
// publishes the snapshot to the region's coordinator, chunked under the
// server's max payload. Keys with no demand are not sent.
type Publisher struct {
	NC     *nats.Conn
	Region string
	Node   string
	Drain  DrainFunc
	// Period between snapshots; a coordinator sees demand at most one
	// Period late. Default 1 s.
	Period time.Duration
	Log    *slog.Logger
}

// Run publishes until ctx ends, then publishes a last snapshot (so a node
// that stops does not swallow its final demand) and returns nil.
func (p *Publisher) Run(ctx context.Context) error {
	period := p.Period
	if period <= 0 {
		period = time.Second
	}
	log := p.Log
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := p.PublishOnce(); err != nil {
				log.Warn("demand: last snapshot", "err", err)
			}
			return nil
		case <-t.C:
			if err := p.PublishOnce(); err != nil {
				log.Warn("demand: snapshot", "err", err)
			}
		}
	}
}

// PublishOnce drains and publishes one snapshot.
func (p *Publisher) PublishOnce() error {
	subject := Prefix + p.Region
	snaps, err := Snapshots(p.Node, p.Drain, int(p.NC.MaxPayload()))
	for _, b := range snaps {
		if err := p.NC.Publish(subject, b); err != nil {
			return fmt.Errorf("demand: publish %s: %w", subject, err)
		}
	}
	return err
}

// Snapshots drains drain once and returns node's snapshot of it as
// published, each message under maxBytes (Encode, marshalled); keys
// with no demand are left out, and no demand makes no message. The
// simulator (internal/tools/sim) sends its nodes' demand with it.
func Snapshots(node string, drain DrainFunc, maxBytes int) ([][]byte, error) {
	var all []Entry
	drain(func(key string, admitted, denied int64) {
		if admitted > 0 || denied > 0 {
			all = append(all, Entry{key, admitted, denied})
		}
	})
	msgs := Encode(node, all, maxBytes)
	out := make([][]byte, 0, len(msgs))
	for _, msg := range msgs {
		b, err := proto.Marshal(msg)
		if err != nil {
			return out, fmt.Errorf("demand: marshal: %w", err)
		}
		out = append(out, b)
	}
	return out, nil
}

// Entry is one key's demand in a snapshot.
type Entry struct {
	Key              string
	Admitted, Denied int64
}

// Encode sorts entries by key and splits them into snapshots whose
// encoded size stays under maxBytes and whose keys decode to at most
// frontcode.MaxDecoded bytes, front-coding each key against the previous
// key of its snapshot. No entries, no snapshot.
func Encode(node string, entries []Entry, maxBytes int) []*coordv1.Demand {
	if len(entries) == 0 {
		return nil
	}
	slices.SortFunc(entries, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	budget := max(maxBytes-chunkOverhead-len(node), 1024)
	var out []*coordv1.Demand
	msg := &coordv1.Demand{Node: node}
	size, keys, prev := 0, 0, ""
	for _, e := range entries {
		c := frontcode.Common(prev, e.Key)
		de := &coordv1.DemandEntry{Prefix: uint32(c), Suffix: e.Key[c:], Admitted: e.Admitted, Denied: e.Denied}
		n := proto.Size(de)
		n += protowire.SizeTag(2) + protowire.SizeVarint(uint64(n))
		if len(msg.Entries) > 0 && (size+n > budget || keys+len(e.Key) > frontcode.MaxDecoded) {
			out = append(out, msg)
			msg, size, keys = &coordv1.Demand{Node: node}, 0, 0
			de.Prefix, de.Suffix = 0, e.Key // a snapshot decodes on its own
			n = proto.Size(de)
			n += protowire.SizeTag(2) + protowire.SizeVarint(uint64(n))
		}
		msg.Entries = append(msg.Entries, de)
		size += n
		keys += len(e.Key)
		prev = e.Key
	}
	return append(out, msg)
}

// Decode calls fn with every entry of one snapshot. A snapshot whose keys
// decode past frontcode.MaxDecoded, which Encode never makes, is refused
// with an error before any key is decoded.
func Decode(m *coordv1.Demand, fn func(key string, admitted, denied int64)) error {
	var size frontcode.Size
	for _, e := range m.GetEntries() {
		if !size.Add(e.GetPrefix(), len(e.GetSuffix())) {
			return fmt.Errorf("demand: keys decode past %d bytes", frontcode.MaxDecoded)
		}
	}
	prev := ""
	for _, e := range m.GetEntries() {
		key := frontcode.Decode(prev, e.GetPrefix(), e.GetSuffix())
		prev = key
		fn(key, e.GetAdmitted(), e.GetDenied())
	}
	return nil
}
