package coord

import "time"

// When a Machine acts: its clock, the rounds' starts, and the demand
// window drained before each.

// timing is a Machine's time: the last Tick and the instants due next.
type timing struct {
	now     time.Time // of the last Tick
	ticked  bool
	next    time.Time // start of the next round
	renewAt time.Time // next lock renewal (active) or poll (standby); zero: none
}

// demandWindow is the end of each interval whose demand the shares follow
// (the whole interval when it is shorter): a shift older than the window
// plus the nodes' publication lag is seen whole at the next epoch, not
// averaged with the traffic before it. Three seconds hold exactly three of
// each node's 1 s snapshots (demand.Publisher), so no node's rate is read a
// snapshot short or long.
const demandWindow = 3 * time.Second

// openWindow asks for the drain that opens the next round's demand window
// once it is due, between rounds.
func (m *Machine) openWindow() {
	if w := m.windowAt(); m.ep == nil && !w.IsZero() && !m.clock.now.Before(w) && m.clock.now.Before(m.clock.next) {
		m.out.Drain, m.reports.windowing, m.reports.windowFor, m.reports.windowAsk = true, true, m.clock.next, m.clock.now
	}
}

// windowAt is when the next round's demand window opens, zero when it is
// not to be drained for: the window is the whole interval, or its drain
// was asked already.
func (m *Machine) windowAt() time.Time {
	if demandWindow >= m.cfg.Knobs.Interval || m.reports.windowFor.Equal(m.clock.next) {
		return time.Time{}
	}
	return m.clock.next.Add(-demandWindow)
}

// nextStart is the start of the first round after t: the next epoch, or
// the mid-interval round before it.
func (m *Machine) nextStart(t time.Time) time.Time {
	iv := m.cfg.Knobs.Interval.Nanoseconds()
	k := t.UnixNano() / iv
	if mid := k*iv + iv/2; midRounds(m.cfg.Knobs.Interval) && mid > t.UnixNano() {
		return time.Unix(0, mid)
	}
	return time.Unix(0, (k+1)*iv)
}

// midRounds reports whether epochs of interval iv have a mid-interval
// round: when half an interval holds a whole demand window. A shorter
// interval already follows a shift within a few seconds.
func midRounds(iv time.Duration) bool { return iv >= 2*demandWindow }
