package coord

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// vnet runs real Machines in virtual time: it is every region's driver at
// once. Time jumps from one event to the next (a machine's Next, a
// message's delivery), so an epoch of virtual time costs microseconds and
// no test sleeps. Every I/O a machine asks for is executed at once against
// the shared global ledger, which checks Theorem 1 on every single write.
type vnet struct {
	now          time.Time
	regions      []string
	members      []*member
	globalLedger *globalLedger
	queue        []delivery
	seq          int
	// deliver decides the fate of one message from -> to: the delays of
	// its copies (none: dropped). Nil delivers every message after 1 ms.
	deliver func(from, to *member, m *coordv1.Message) []time.Duration
	locks   map[string]*vlock
	// trace, when set, receives a line for every Ready of every member.
	trace func(string)
	// meddle, when set, is handed each member's machine before its every
	// Ready: a test's way to break a machine from the outside.
	meddle func(*Machine)
	// events counts the steps of runUntil, a guard against livelock.
	events int
	// quotas, when set, makes the machines exchange global quota counts:
	// counts[region] is what ReadCounts finds, remote[region] what
	// WriteQuotas stored (raised only, as quota.lua does).
	quotas Quotas
	counts map[string]map[string]QuotaCount
	remote map[string]map[string]QuotaCount
}

// member is one coordinator process: a machine and its region's demand.
type member struct {
	id, region string
	m          *Machine
	skew       time.Duration // its clock minus the virtual clock
	rates      map[string]float64
	tokens     map[string]float64 // demand since the last drain, up to accrued
	accrued    time.Time
	stopped    bool
	lockTTL    time.Duration // 0: no lock, always active
	rounds     []Round
}

type delivery struct {
	at  time.Time
	seq int
	to  *member
	msg *coordv1.Message
}

// vlock is a region's lock in virtual time (RedisLock's semantics: held
// until its TTL passes without a renewal).
type vlock struct {
	holder string
	until  time.Time
}

// newVnet returns an empty world of regions; t (nil: none) is failed on
// any write that breaks Theorem 1.
func newVnet(t testing.TB, regions ...string) *vnet {
	return &vnet{now: time.Unix(1_800_000_000, 0), regions: regions, globalLedger: newLedger(t, regions), locks: map[string]*vlock{},
		counts: map[string]map[string]QuotaCount{}, remote: map[string]map[string]QuotaCount{}}
}

// discard is the logger of the property tests' machines.
var discard = slog.New(slog.DiscardHandler)

// add starts a coordinator of region with knobs k.
func (n *vnet) add(id, region string, k Knobs, lockTTL time.Duration, log *slog.Logger) *member {
	cfg := MachineConfig{Region: region, Regions: n.regions, Limits: testLimits, Quotas: n.quotas, Knobs: k, Logger: log}
	if lockTTL > 0 {
		cfg.LockRenew = lockTTL / 3
		if n.locks[region] == nil {
			n.locks[region] = &vlock{}
		}
	}
	m, err := NewMachine(cfg)
	if err != nil {
		panic(err) // a test's own configuration
	}
	mb := &member{id: id, region: region, m: m, rates: map[string]float64{}, tokens: map[string]float64{}, accrued: n.now, lockTTL: lockTTL}
	n.members = append(n.members, mb)
	return mb
}

// stop crashes mb: it takes no more input. release gives its lock up (a
// clean stop) instead of leaving it to expire.
func (n *vnet) stop(mb *member, release bool) {
	mb.stopped = true
	if l := n.locks[mb.region]; release && l != nil && l.holder == mb.id {
		l.holder = ""
	}
}

// setDemand sets every region's demand of key (tokens/s), in n.regions'
// order, from now on.
func (n *vnet) setDemand(key string, rates ...float64) {
	for _, mb := range n.members {
		mb.accrue(n.now)
		mb.rates[key] = rates[slices.Index(n.regions, mb.region)]
	}
}

// accrue counts the demand at the rates in force up to now.
func (mb *member) accrue(now time.Time) {
	secs := now.Sub(mb.accrued).Seconds()
	mb.accrued = now
	for k, r := range mb.rates {
		mb.tokens[k] += r * secs
	}
}

// share is region's share of key in force.
func (n *vnet) share(region, key string) rebalance.Share {
	return n.globalLedger.shareLocked(region, key)
}

func (n *vnet) shares(key string) []rebalance.Share {
	out := make([]rebalance.Share, len(n.regions))
	for i, r := range n.regions {
		out[i] = n.share(r, key)
	}
	return out
}

// run advances virtual time by d.
func (n *vnet) run(d time.Duration) { n.runUntil(n.now.Add(d)) }

// runUntil processes every event up to end, in time order; events at the
// same instant go deliveries first, then members in the order added.
func (n *vnet) runUntil(end time.Time) {
	for {
		t := end
		for _, mb := range n.members {
			if mb.stopped {
				continue
			}
			if nx := mb.m.Next(); nx.IsZero() {
				t = n.now
			} else if at := nx.Add(-mb.skew); at.Before(t) {
				t = at
			}
		}
		if len(n.queue) > 0 && n.queue[0].at.Before(t) {
			t = n.queue[0].at
		}
		n.now = maxTime(n.now, t)
		if n.events++; n.events > 50_000_000 {
			panic("vnet: livelock")
		}
		for len(n.queue) > 0 && !n.queue[0].at.After(n.now) {
			d := n.queue[0]
			n.queue = n.queue[1:]
			if d.to.stopped {
				continue
			}
			d.to.m.Tick(n.now.Add(d.to.skew))
			d.to.m.Step(Received{Wire: mustMarshal(d.msg)})
			n.drive(d.to)
		}
		for _, mb := range n.members {
			// Only a member with something due: Tick is a no-op for the rest.
			if nx := mb.m.Next(); !mb.stopped && !nx.Add(-mb.skew).After(n.now) {
				mb.m.Tick(n.now.Add(mb.skew))
				n.drive(mb)
			}
		}
		if !n.now.Before(end) {
			return
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// send queues a message after d.
func (n *vnet) send(to *member, m *coordv1.Message, d time.Duration) {
	at := n.now.Add(d)
	i := sort.Search(len(n.queue), func(i int) bool { return n.queue[i].at.After(at) })
	n.queue = slices.Insert(n.queue, i, delivery{at: at, seq: n.seq, to: to, msg: m})
	n.seq++
}

// drive executes mb's Ready, as Coordinator.execute does, until it asks
// for nothing more.
func (n *vnet) drive(mb *member) {
	ctx := context.Background()
	w := n.globalLedger.writer(mb.region)
	for {
		if n.meddle != nil {
			n.meddle(mb.m)
		}
		rd := mb.m.Ready()
		if rd.Empty() {
			return
		}
		if n.trace != nil {
			n.trace(traceReady(mb.id, &rd))
		}
		for _, msg := range rd.Messages {
			for _, to := range n.members {
				if to == mb {
					continue
				}
				delays := []time.Duration{time.Millisecond}
				if n.deliver != nil {
					delays = n.deliver(mb, to, msg)
				}
				for _, d := range delays {
					n.send(to, msg, d)
				}
			}
		}
		if rd.Drain {
			mb.accrue(n.now)
			tokens := mb.tokens
			mb.tokens = map[string]float64{}
			mb.m.Step(Drained{tokens})
		}
		if rd.Hold {
			mb.m.Step(LockHeld{Held: n.hold(mb)})
		}
		if rd.ReadCounts != nil {
			out := map[string]QuotaCount{}
			for _, k := range rd.ReadCounts {
				if c, ok := n.counts[mb.region][k]; ok {
					out[k] = c
				}
			}
			mb.m.Step(Counted{Counts: out})
		}
		if rd.ReadShares {
			s, err := w.ReadShares(ctx, rd.ShareKeys, testLimits)
			mb.m.Step(SharesRead{s, err})
		}
		if len(rd.WriteQuotas) > 0 {
			if n.remote[mb.region] == nil {
				n.remote[mb.region] = map[string]QuotaCount{}
			}
			for _, u := range rd.WriteQuotas {
				if old := n.remote[mb.region][u.Key]; u.Window > old.Window || (u.Window == old.Window && u.Used > old.Used) {
					n.remote[mb.region][u.Key] = QuotaCount{Window: u.Window, Used: u.Used}
				}
			}
			mb.m.Step(QuotasWritten{})
		}
		if len(rd.WriteShares) > 0 {
			mb.m.Step(SharesWritten{w.WriteShares(ctx, rd.WriteShares)})
		}
		if rd.Round != nil {
			mb.rounds = append(mb.rounds, *rd.Round)
		}
	}
}

func (n *vnet) hold(mb *member) bool {
	l := n.locks[mb.region]
	if mb.lockTTL == 0 || l == nil {
		return true
	}
	if l.holder == mb.id || l.holder == "" || !n.now.Before(l.until) {
		l.holder, l.until = mb.id, n.now.Add(mb.lockTTL)
		return true
	}
	return false
}

// traceReady renders a Ready exactly (messages as deterministic protobuf).
func traceReady(id string, rd *Ready) string {
	s := id + ":"
	for _, m := range rd.Messages {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			panic(err)
		}
		s += " msg=" + hex.EncodeToString(b)
	}
	r := ""
	if rd.Round != nil {
		r = fmt.Sprintf("%+v", *rd.Round)
	}
	return s + fmt.Sprintf(" drain=%v hold=%v counts=%v read=%v%v quotas=%v shares=%+v round=%s",
		rd.Drain, rd.Hold, rd.ReadCounts, rd.ReadShares, rd.ShareKeys, rd.WriteQuotas, rd.WriteShares, r)
}

// rounds counts the epochs member mb ran as the active coordinator.
func (mb *member) ran() int64 { return mb.m.Stats().Rounds }

// mustMarshal is msg as it travels.
func mustMarshal(msg *coordv1.Message) []byte {
	b, err := proto.Marshal(msg)
	if err != nil {
		panic(err) // a message the machine built
	}
	return b
}
