package coord

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

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// DrainFunc is the shape of (*lease.Manager).DrainDemand: it calls fn once
// per key with the tokens admitted and denied since the previous call.
type DrainFunc func(fn func(key string, admitted, denied int64))

// DemandSource gives the coordinator its region's demand.
type DemandSource interface {
	// Drain calls fn with every key's admitted and denied tokens since the
	// previous Drain.
	Drain(fn func(key string, admitted, denied int64))
}

// Drain lets a DrainFunc (a lease.Manager's DrainDemand, in a process
// that runs node and coordinator together) be a DemandSource.
func (f DrainFunc) Drain(fn func(key string, admitted, denied int64)) { f(fn) }

// Demand sums the demand snapshots the region's nodes publish on
// allot.demand.<region>. It is a DemandSource.
type Demand struct {
	log *slog.Logger
	sub *nats.Subscription

	mu  sync.Mutex
	sum map[string][2]int64
}

// SubscribeDemand starts collecting region's demand from nc. Close ends it.
func SubscribeDemand(nc *nats.Conn, region string, log *slog.Logger) (*Demand, error) {
	if log == nil {
		log = slog.Default()
	}
	d := &Demand{log: log, sum: map[string][2]int64{}}
	sub, err := subscribe(nc, DemandPrefix+region, d.receive)
	if err != nil {
		return nil, err
	}
	d.sub = sub
	return d, nil
}

func (d *Demand) receive(msg *nats.Msg) {
	var m coordv1.Demand
	if err := proto.Unmarshal(msg.Data, &m); err != nil {
		d.log.Warn("coord: dropping undecodable demand", "err", err)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	prev := ""
	for _, e := range m.GetEntries() {
		p := min(int(e.GetPrefix()), len(prev))
		key := prev[:p] + e.GetSuffix()
		prev = key
		v := d.sum[key]
		d.sum[key] = [2]int64{v[0] + max(0, e.GetAdmitted()), v[1] + max(0, e.GetDenied())}
	}
}

// Drain implements DemandSource.
func (d *Demand) Drain(fn func(key string, admitted, denied int64)) {
	d.mu.Lock()
	sum := d.sum
	d.sum = make(map[string][2]int64, len(sum))
	d.mu.Unlock()
	for k, v := range sum {
		fn(k, v[0], v[1])
	}
}

// Close stops collecting.
func (d *Demand) Close() error {
	if err := d.sub.Unsubscribe(); err != nil {
		return fmt.Errorf("coord: unsubscribe demand: %w", err)
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
				log.Warn("coord: last demand snapshot", "err", err)
			}
			return nil
		case <-t.C:
			if err := p.PublishOnce(); err != nil {
				log.Warn("coord: demand snapshot", "err", err)
			}
		}
	}
}

// PublishOnce drains and publishes one snapshot.
func (p *Publisher) PublishOnce() error {
	type kv struct {
		key              string
		admitted, denied int64
	}
	var all []kv
	p.Drain(func(key string, admitted, denied int64) {
		if admitted > 0 || denied > 0 {
			all = append(all, kv{key, admitted, denied})
		}
	})
	if len(all) == 0 {
		return nil
	}
	slices.SortFunc(all, func(a, b kv) int { return strings.Compare(a.key, b.key) })
	budget := max(int(p.NC.MaxPayload())-chunkOverhead-len(p.Node), 1024)
	subject := DemandPrefix + p.Region
	msg := &coordv1.Demand{Node: p.Node}
	size, prev := 0, ""
	flush := func() error {
		b, err := proto.Marshal(msg)
		if err != nil {
			return fmt.Errorf("coord: marshal demand: %w", err)
		}
		if err := p.NC.Publish(subject, b); err != nil {
			return fmt.Errorf("coord: publish %s: %w", subject, err)
		}
		msg.Entries, size, prev = msg.Entries[:0], 0, ""
		return nil
	}
	for _, e := range all {
		c := commonPrefix(prev, e.key)
		de := &coordv1.DemandEntry{Prefix: uint32(c), Suffix: e.key[c:], Admitted: e.admitted, Denied: e.denied}
		n := proto.Size(de)
		n += protowire.SizeTag(2) + protowire.SizeVarint(uint64(n))
		if len(msg.Entries) > 0 && size+n > budget {
			if err := flush(); err != nil {
				return err
			}
			de.Prefix, de.Suffix = 0, e.key
			n = proto.Size(de)
			n += protowire.SizeTag(2) + protowire.SizeVarint(uint64(n))
		}
		msg.Entries = append(msg.Entries, de)
		size += n
		prev = e.key
	}
	return flush()
}
