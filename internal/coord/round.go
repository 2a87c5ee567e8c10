package coord

import (
	"maps"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// A round under way: its stages and state, how it starts and ends, and
// the steps of an epoch's round.

type stage int

const (
	stageStart   stage = iota // awaiting Drained and LockHeld
	stageCount                // awaiting Counted
	stageReports              // gathering the others' reports
	stageListen               // a new active's first epoch: gathering reports only
	stageRead                 // awaiting SharesRead
	stageShrink               // awaiting the phase-1 writes
	stageAcks                 // gathering acks
	stageHold                 // awaiting LockHeld before growing
	stageGrow                 // awaiting the phase-2 writes
)

// epoch is the state of the epoch under way.
type epoch struct {
	id    roundID
	kind  roundKind
	k     Knobs
	start time.Time
	stage stage
	r     *round

	// Results awaited (a stage moves on once none is).
	wantDrain, wantHold, wantCount, wantRead, wantShares, wantQuotas bool

	rates   map[string]float64
	counts  map[string]QuotaCount
	mine    []entry
	heard   []string
	plans   *plans
	writing []ShareUpdate
	remote  []RemoteCount
	ok      bool
	st      Stats
	asked   stage // the last gather that asked for what it missed
}

// roundKind is what an epoch's round and its mid-interval round do
// differently: how they begin, how long they gather, what they report and
// plan, and how they end. Every other step (gathering the reports, the
// ack, the grow) is the same for both, in Machine.advance. A round's kind
// is fixed when it begins: fullRound at an interval boundary, midRound
// (mid.go) halfway.
type roundKind interface {
	// begin asks for what the round's first stage awaits, or reports
	// false when this region skips the round.
	begin(m *Machine, e *epoch) bool
	// span is the part of interval iv the round's gathers divide.
	span(iv time.Duration) time.Duration
	// open runs once the first stage's results are in: it publishes this
	// region's report and gathers the others', or moves on to what the
	// report needs first.
	open(m *Machine, e *epoch)
	// shrink is phase 1, once the reports are gathered: it plans and asks
	// for the shrunk shares to be written, or ends the round.
	shrink(m *Machine, e *epoch)
	// end records the finished active round: its stats and the Round to
	// observe.
	end(m *Machine, e *epoch)
}

// fullRound is an epoch's round: every key reported, quota counts
// exchanged, a new active coordinator's first round spent listening.
type fullRound struct{}

// phase is how long each gather waits: Gather of the round's span.
func (e *epoch) phase() time.Duration {
	return time.Duration(float64(e.kind.span(e.k.Interval)) * e.k.Gather)
}

// gather returns, for a stage that gathers the other regions' messages,
// when it asks for what is missing and when it gives up on it: half its
// phase, and the phase's end.
func (e *epoch) gather() (ask, end time.Time, ok bool) {
	phase := e.phase()
	from := e.start
	switch e.stage {
	case stageReports, stageListen:
	case stageAcks:
		from = from.Add(phase)
	default:
		return ask, end, false
	}
	return from.Add(phase / 2), from.Add(phase), true
}

// begin starts the round due at m.clock.next: an epoch, or its mid-interval
// round.
func (m *Machine) begin() {
	k := m.cfg.Knobs
	iv := k.Interval.Nanoseconds()
	start := m.clock.next
	e := &epoch{id: roundID{start.UnixNano() / iv, k.Interval.Milliseconds(), start.UnixNano()%iv != 0}, k: k, start: start, stage: stageStart}
	e.kind = fullRound{}
	if e.id.mid {
		e.kind = midRound{}
	}
	m.inbox.own = [2]int64{e.id.intervalMS, e.id.intervalMS}
	if !e.kind.begin(m, e) {
		m.finish()
		return
	}
	m.ep = e
}

func (fullRound) begin(m *Machine, e *epoch) bool {
	e.wantDrain, e.wantHold = true, true
	m.out.Drain, m.out.Hold = true, true
	m.role.renewing = false // this Hold answers for it
	return true
}

func (fullRound) span(iv time.Duration) time.Duration { return iv }

// open: a new active coordinator listens; the others read their global
// quota counts (if any) and report.
func (fullRound) open(m *Machine, e *epoch) {
	if m.role.listening {
		e.stage = stageListen
		return
	}
	e.stage = stageCount
	if keys := m.quotaKeys(e.start, e.k); len(keys) > 0 {
		e.wantCount = true
		m.out.ReadCounts = keys
	}
}

// done ends the active round under way.
func (m *Machine) done(e *epoch) {
	e.kind.end(m, e)
	m.finish()
}

// finish ends the round under way and schedules the next. A round that
// ran into the next one's window opens it now, not at the next Tick.
func (m *Machine) finish() {
	m.ep = nil
	m.clock.next = m.nextStart(m.clock.now)
	m.openWindow()
}

// report builds and publishes this region's report.
func (m *Machine) report(e *epoch) {
	e.st = Stats{Epoch: e.id.epoch}
	e.mine = m.reports.entries(e.rates, e.k, &m.ledger)
	quotaEntries := m.quotaReport(e.counts, e.k)
	e.st.Quotas = len(quotaEntries)
	msgs := m.encodeReport(e, append(slices.Clip(e.mine), quotaEntries...))
	for _, msg := range msgs {
		e.st.ReportBytes += proto.Size(msg)
	}
	e.st.Reported, e.st.Chunks = len(e.mine), len(msgs)
	e.r.report = msgs
	m.out.Messages = append(m.out.Messages, msgs...)
}

// encodeReport encodes this region's report of round e, or nothing when
// it needs more than maxChunks chunks, which the other regions refuse: it
// is then lost for all of them (a partition, which is safe).
func (m *Machine) encodeReport(e *epoch, entries []entry) []*coordv1.Message {
	msgs := encodeReport(m.cfg.Region, e.id, entries, m.cfg.MaxPayload)
	if len(msgs) > maxChunks {
		m.log.Error("coord: report too large to send", "epoch", e.id.epoch, "mid", e.id.mid, "entries", len(entries), "chunks", len(msgs), "max", maxChunks)
		return nil
	}
	return msgs
}

// shrink is phase 1: plan every key, write the shrunk shares and the
// remote quota counts.
func (fullRound) shrink(m *Machine, e *epoch) {
	e.heard = m.inbox.heard(e.r)
	m.reports.base = midBase{epoch: e.id.epoch, all: len(e.heard) == len(m.cfg.Regions), mine: e.mine}
	e.plans = m.planner.plan(e.r, e.mine, e.heard, m.inbox.last, e.k)
	// Quota counts need no two phases: they only ever raise what a region
	// counts against its limit.
	m.fileQuotas(e.r, e.heard)
	e.remote = m.quotaUpdates(e.start)
	e.st.Heard, e.st.Keys = len(e.heard), len(e.plans.keys)
	if len(e.remote) > 0 {
		e.wantQuotas = true
		m.out.WriteQuotas = e.remote
	}
	m.writeShrunk(e, true)
}

// writeShrunk asks for the first phase's writes of e's plans (with
// refresh, also the unchanged shares updates lists) and awaits them.
func (m *Machine) writeShrunk(e *epoch, refresh bool) {
	e.writing = m.ledger.updates(e.plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Shrunk[kp.Self] }, e.k, refresh)
	e.st.Written += len(e.writing)
	e.stage, e.ok = stageShrink, true
	if len(e.writing) > 0 {
		e.wantShares = true
		m.out.WriteShares = e.writing
	}
}

func (fullRound) end(m *Machine, e *epoch) {
	e.st.Rounds = m.stats.Rounds + 1
	m.stats = e.st
	shares := make([]rebalance.Share, 0, len(m.ledger.own))
	for _, key := range slices.Sorted(maps.Keys(m.ledger.own)) {
		shares = append(shares, m.ledger.own[key])
	}
	m.out.Round = &Round{Start: e.start, Stats: e.st, Regions: len(m.cfg.Regions), Shares: shares}
	m.log.Debug("coord: epoch", "epoch", e.id.epoch, "heard", e.st.Heard, "group", e.st.Group, "keys", e.st.Keys, "written", e.st.Written, "report_bytes", e.st.ReportBytes)
}
