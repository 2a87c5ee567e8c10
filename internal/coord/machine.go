package coord

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/allot-dev/allot/internal/ratelog"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// Machine is one region's coordinator protocol as a pure state machine, in
// the style of etcd raft's Node/Ready split: time enters only through
// Tick(now), everything else (the other regions' messages, the results of
// the I/O it asked for) only through Step, and everything to do comes out
// of Ready. It has no goroutine, no clock and no I/O of its own, so a test
// can drive any number of machines through any schedule in virtual time,
// and two runs with the same inputs give the same outputs.
//
// One epoch (docs/multi-region.md, "The epoch protocol"):
//
//	Tick(start - demandWindow) -> Ready{Drain}         (the window opens)
//	Tick(epoch start)  -> Ready{Drain, Hold}
//	Step(Drained), Step(LockHeld)
//	                   -> Ready{ReadCounts}            (global quotas only)
//	Step(Counted)      -> Ready{Messages: report}
//	Step(Received)...  until every report or Tick(start + Gather·I)
//	                   -> Ready{WriteQuotas, WriteShares: shrinks}
//	Step(SharesWritten), Step(QuotasWritten)
//	                   -> Ready{Messages: ack}
//	Step(Received)...  until every ack or Tick(start + 2·Gather·I)
//	                   -> Ready{Hold}                   (a lost lock must not grow)
//	Step(LockHeld)     -> Ready{WriteShares: grows}
//	Step(SharesWritten)-> Ready{Round}
//
// A gather still missing messages at half its phase publishes a Want for
// them, and a Want naming this region is answered by Step(Received) with
// the round's report or ack again (docs/multi-region.md, "Lost messages").
//
// Halfway through an epoch of at least 2·demandWindow, its mid-interval
// round (mid.go) does the same without counts or quota writes: the two
// are the kinds of a round (roundKind, round.go), and advance runs the
// steps they share.
//
// A Machine is not safe for concurrent use: one goroutine (the driver,
// Coordinator.Run, or a test) owns it.
type Machine struct {
	cfg MachineConfig // Knobs: for the next epoch
	log *slog.Logger

	clock   timing   // the time and what is due when
	role    role     // the lock: active, listening or standby
	ledger  ledger   // the shares this region owns
	reports reporter // demand drained and smoothed into this region's reports
	inbox   inbox    // the other regions' reports and acks
	planner planner  // the rebalance plans of a round
	quota   quotas
	stats   Stats // the last active epoch's

	ep  *epoch // the round under way, nil between rounds
	out Ready  // what the next Ready returns
}

// role is a Machine's standing with its region's lock.
type role struct {
	active    bool
	listening bool // first epoch after becoming active: learn, do not act
	renewing  bool // a renewal's LockHeld is awaited between epochs
}

// MachineConfig is what a Machine is built from.
type MachineConfig struct {
	Region  string
	Regions []string // every region, Region included
	// Limits is required. Quotas nil means global quotas are not
	// exchanged (Coordinator passes Limits when it implements Quotas and
	// a QuotaStore is configured).
	Limits Limits
	Quotas Quotas
	// Knobs are the initial settings; zero means DefaultKnobs.
	Knobs Knobs
	// MaxPayload bounds one report chunk's encoded size; zero means 1 MiB.
	MaxPayload int
	// LockRenew is how often an active machine asks for its lock to be
	// renewed while it waits inside an epoch, and how often a standby asks
	// for it between epochs, so a crashed active's lock is taken within
	// its TTL plus LockRenew, not at the next epoch's start. Zero asks only
	// at the epoch's start and before growing (no lock, or a driver that
	// renews itself).
	LockRenew time.Duration
	Logger    *slog.Logger
}

// NewMachine checks cfg and returns a Machine, standby until its first
// LockHeld{Held: true}.
func NewMachine(cfg MachineConfig) (*Machine, error) {
	var errs []error
	if cfg.Region == "" {
		errs = append(errs, errors.New("no region"))
	}
	if !slices.Contains(cfg.Regions, cfg.Region) {
		errs = append(errs, fmt.Errorf("region %q is not in regions %v", cfg.Region, cfg.Regions))
	}
	if cfg.Limits == nil {
		errs = append(errs, errors.New("limits are required"))
	}
	if cfg.Knobs == (Knobs{}) {
		cfg.Knobs = DefaultKnobs()
	}
	if err := cfg.Knobs.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("coord: %w", err)
	}
	cfg.Regions = slices.Compact(slices.Sorted(slices.Values(cfg.Regions)))
	if cfg.MaxPayload <= 0 {
		cfg.MaxPayload = 1 << 20
	}
	m := &Machine{
		cfg:     cfg,
		log:     cfg.Logger,
		ledger:  ledger{def: rebalance.Default(len(cfg.Regions)), limits: cfg.Limits, own: map[string]rebalance.Share{}, unsure: map[string]bool{}},
		reports: reporter{regions: len(cfg.Regions), limits: cfg.Limits, weight: map[string]float64{}},
		inbox:   inbox{self: cfg.Region, regions: cfg.Regions, last: map[string][]entry{}, rounds: map[roundID]*round{}},
		quota:   newQuotas(),
		planner: planner{self: cfg.Region, regions: cfg.Regions, limits: cfg.Limits},
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.log = m.log.With("region", cfg.Region)
	iv := cfg.Knobs.Interval.Milliseconds()
	m.inbox.own = [2]int64{iv, iv}
	// What other regions send may be forged or corrupt: the inbox's warnings
	// about it are rate-limited on the machine's own clock.
	m.inbox.log = ratelog.New(m.log, ratelog.DefaultEvery, func() time.Time { return m.clock.now })
	return m, nil
}

// SetKnobs replaces the settings; the next epoch uses them.
func (m *Machine) SetKnobs(k Knobs) error {
	if err := k.Validate(); err != nil {
		return fmt.Errorf("coord: knobs: %w", err)
	}
	m.cfg.Knobs = k
	m.inbox.own[1] = k.Interval.Milliseconds() // own[0]: the round under way's, or the last's
	return nil
}

// Active reports whether the machine holds its region's lock.
func (m *Machine) Active() bool { return m.role.active }

// Stats returns the last active epoch's figures.
func (m *Machine) Stats() Stats { return m.stats }

// Next is the earliest instant at which Tick has something to do: the
// next epoch's start, the end of a gather phase, or a lock renewal. The
// zero time means "tick me now" (before the first Tick).
func (m *Machine) Next() time.Time {
	if !m.clock.ticked {
		return time.Time{}
	}
	next := m.clock.next
	if w := m.windowAt(); m.ep == nil && !w.IsZero() {
		next = w
	}
	if m.ep != nil {
		if ask, end, ok := m.ep.gather(); ok {
			next = end
			if m.ep.asked != m.ep.stage {
				next = ask
			}
		}
	}
	if !m.clock.renewAt.IsZero() && m.clock.renewAt.Before(next) {
		next = m.clock.renewAt
	}
	return next
}

// Ready returns what the driver must do now and forgets it.
func (m *Machine) Ready() Ready {
	rd := m.out
	m.out = Ready{}
	return rd
}

// Tick tells the machine the time. Time never goes back for a machine: an
// earlier now is taken as the last one.
func (m *Machine) Tick(now time.Time) {
	if m.clock.ticked && now.Before(m.clock.now) {
		now = m.clock.now
	}
	m.clock.now = now
	if !m.clock.ticked {
		m.clock.ticked = true
		m.reports.lastDrain = now
		m.clock.next = m.nextStart(now)
		if m.cfg.LockRenew > 0 {
			m.clock.renewAt = now.Add(m.cfg.LockRenew) // a standby polls the lock
		}
	}
	if !m.clock.renewAt.IsZero() && !now.Before(m.clock.renewAt) && (m.ep == nil || !m.ep.wantHold) {
		m.out.Hold = true
		m.clock.renewAt = now.Add(m.cfg.LockRenew)
		if m.ep != nil {
			m.ep.wantHold = true
		} else {
			m.role.renewing = true
		}
	}
	m.openWindow()
	if m.ep == nil && !now.Before(m.clock.next) {
		m.begin()
	}
	m.advance()
}

// Step takes one input.
func (m *Machine) Step(in Input) {
	e := m.ep
	switch in := in.(type) {
	case Received:
		m.out.Messages = append(m.out.Messages, m.inbox.fileWire(in.Wire, m.clock.now)...)
	case Drained:
		switch {
		case e != nil && e.wantDrain:
			e.wantDrain, m.reports.windowing = false, false
			m.noteUsed(in.Tokens, e.start)
			e.rates = m.reports.rates(e.start, in.Tokens)
		case m.reports.windowing:
			// The demand before the window: quota keys still note it,
			// shares do not follow it.
			m.reports.windowing, m.reports.lastDrain = false, m.reports.windowAsk
			m.noteUsed(in.Tokens, m.reports.windowAsk)
			return
		default:
			return
		}
	case LockHeld:
		if in.Err != nil {
			m.log.Warn("coord: lock", "err", in.Err)
		}
		m.elect(in.Held)
		switch {
		case e != nil && e.wantHold:
			e.wantHold = false
			if !m.role.active {
				m.finish() // standby (or just lost the lock): nothing more this epoch
				return
			}
		case m.role.renewing:
			m.role.renewing = false
		}
	case Counted:
		if e == nil || !e.wantCount {
			return
		}
		e.wantCount = false
		if in.Err != nil {
			// Not reporting is safe for the others only in the sense of the
			// lag bound: they keep the last count they heard.
			m.log.Warn("coord: read quota counts", "err", in.Err)
		}
		e.counts = in.Counts
	case SharesRead:
		if e == nil || !e.wantRead {
			return
		}
		e.wantRead = false
		if in.Err != nil {
			m.log.Warn("coord: read shares; listening another epoch", "err", in.Err)
		} else {
			m.ledger.takeOver(in.Shares)
			m.role.listening = false
			m.log.Info("coord: took over", "keys", len(m.ledger.own))
		}
		m.finish()
		return
	case SharesWritten:
		if e == nil || !e.wantShares {
			return
		}
		e.wantShares = false
		if in.Err != nil {
			m.log.Warn("coord: write shares", "n", len(e.writing), "err", in.Err)
		}
		ok := m.ledger.record(e.writing, in.Err)
		if e.stage == stageShrink {
			e.ok = ok
		}
		e.writing = nil
	case QuotasWritten:
		if e == nil || !e.wantQuotas {
			return
		}
		e.wantQuotas = false
		m.recordQuotas(e.remote, in.Err)
		e.remote = nil
	}
	m.advance()
}

// advance moves the epoch under way through every stage it can finish.
func (m *Machine) advance() {
	for {
		e := m.ep
		if e == nil || e.wantDrain || e.wantHold || e.wantCount || e.wantRead || e.wantShares || e.wantQuotas {
			return
		}
		_, end, _ := e.gather()
		switch e.stage {
		case stageStart:
			e.r = m.inbox.roundOrEmpty(e.id, m.clock.now)
			e.kind.open(m, e)
		case stageCount:
			m.report(e)
			e.stage = stageReports
		case stageReports:
			if m.waiting(e, m.inbox.missingReports(e.r), end) {
				return
			}
			e.kind.shrink(m, e)
		case stageShrink:
			e.r.ack = &coordv1.Message{Region: m.cfg.Region, Epoch: e.id.epoch, IntervalMs: e.id.intervalMS, Mid: e.id.mid,
				Body: &coordv1.Message_Ack{Ack: &coordv1.Ack{Heard: e.heard, Ok: e.ok}}}
			m.out.Messages = append(m.out.Messages, e.r.ack)
			e.stage = stageAcks
		case stageAcks:
			if m.waiting(e, m.inbox.missingAcks(e.r, e.heard), end) {
				return
			}
			e.st.Group = e.ok && len(e.heard) > 1 && m.inbox.group(e.r, e.heard)
			group := e.st.Group
			e.writing = m.ledger.updates(e.plans, func(kp rebalance.KeyPlan) rebalance.Share { return kp.Grow(group) }, e.k, false)
			if len(e.writing) == 0 {
				m.done(e)
				return
			}
			e.stage, e.wantHold = stageHold, true
			m.out.Hold = true
		case stageHold:
			e.stage, e.wantShares = stageGrow, true
			m.out.WriteShares = e.writing
			e.st.Written += len(e.writing)
		case stageGrow:
			m.done(e)
			return
		case stageListen:
			if m.waiting(e, m.inbox.missingReports(e.r), end) {
				return
			}
			m.inbox.heard(e.r)
			keys := map[string]bool{}
			for _, es := range m.inbox.last {
				for _, e := range es {
					if e.share != 0 {
						keys[e.key] = true
					}
				}
			}
			e.stage, e.wantRead = stageRead, true
			m.out.ReadShares, m.out.ShareKeys = true, slices.Sorted(maps.Keys(keys))
			return
		default:
			return
		}
	}
}

// waiting reports whether e's gather, missing the regions named, waits on
// until end. Once half of it has passed it asks them, once, for what is
// missing (a Want): a message lost on the way is sent again within the
// phase instead of losing the round (docs/multi-region.md, "Lost
// messages").
func (m *Machine) waiting(e *epoch, missing []string, end time.Time) bool {
	if len(missing) == 0 || !m.clock.now.Before(end) {
		return false
	}
	if ask, _, _ := e.gather(); e.asked != e.stage && !m.clock.now.Before(ask) {
		e.asked = e.stage
		w := &coordv1.Want{}
		if e.stage == stageAcks {
			w.Acks = missing
		} else {
			w.Reports = missing
		}
		m.out.Messages = append(m.out.Messages, &coordv1.Message{Region: m.cfg.Region, Epoch: e.id.epoch, IntervalMs: e.id.intervalMS, Mid: e.id.mid,
			Body: &coordv1.Message_Want{Want: w}})
		e.st.Asked++
	}
	return true
}

// elect applies a lock result. Becoming active starts a listening epoch;
// losing the lock forgets this region's shares (the new active reads them
// from Redis).
func (m *Machine) elect(held bool) {
	switch {
	case held && !m.role.active:
		m.log.Info("coord: active")
		m.role.active, m.role.listening = true, true
		if m.cfg.LockRenew > 0 {
			m.clock.renewAt = m.clock.now.Add(m.cfg.LockRenew)
		}
	case !held && m.role.active:
		m.log.Info("coord: standby")
		m.role.active = false
		if m.cfg.LockRenew > 0 {
			m.clock.renewAt = m.clock.now.Add(m.cfg.LockRenew)
		}
		m.ledger.forget()
		clear(m.reports.weight)
		m.reports.base = midBase{}
		m.quota.reset()
	}
}
