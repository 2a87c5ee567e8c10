package lease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// The refill loop: refills queued per key, sent per stripe as one
// pipeline by the workers, and their replies applied.

// schedule queues a refill of e (need: the cost a caller waits for; want:
// a batch taker's size, 0 for none; see size) and returns the round that
// will serve it.
func (m *Manager) schedule(sh *stripe, e *entry, need, want int64) *round {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return m.scheduleLocked(sh, e, need, want)
}

func (m *Manager) scheduleLocked(sh *stripe, e *entry, need, want int64) *round {
	f := e.flags.Load()
	switch {
	case f&flagDead != 0:
		return nil
	case f&flagFlushing != 0:
		return sh.flushing
	case f&flagPending != 0:
		for i := range sh.pending {
			if sh.pending[i].e == e {
				sh.pending[i].need = max(sh.pending[i].need, need)
				sh.pending[i].want = max(sh.pending[i].want, want)
			}
		}
		return sh.next
	}
	e.holdLocked(e.lim.Load(), m.coldKeys)
	e.flags.Store(flagPending)
	sh.pending = append(sh.pending, refill{e, need, want})
	if sh.next == nil {
		sh.next = &round{done: make(chan struct{})}
	}
	if !sh.scheduled {
		sh.scheduled = true
		m.dispatch(sh)
	}
	return sh.next
}

// await queues e for a refill that must bring need tokens (and should
// bring want; see size) and waits for the round serving it. dead reports
// that e was evicted meanwhile.
func (m *Manager) await(ctx context.Context, sh *stripe, e *entry, need, want int64) (dead bool, err error) {
	if m.life.closed.Load() {
		return false, ErrClosed
	}
	r := m.schedule(sh, e, need, want)
	if r == nil {
		return true, nil
	}
	// Only a take with no tokens on hand gets here: the timer is off the
	// lock-free path. A ctx that ends first (a decision's budget) is the
	// only bound: a cap that can never fire is not armed.
	var capped <-chan time.Time
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > m.opts.MaxWait {
		t := time.NewTimer(m.opts.MaxWait)
		defer t.Stop()
		capped = t.C
	}
	select {
	case <-r.done:
		return e.flags.Load()&flagDead != 0, r.err
	case <-ctx.Done():
		return false, waitAborted{ctx.Err()}
	case <-capped:
		return false, ErrWaitTimeout
	}
}

// dispatch hands sh's next flush to whoever runs refill rounds (the
// workers, or Options.Executor). The caller holds sh.mu.
func (m *Manager) dispatch(sh *stripe) { m.life.exec(sh.run) }

func (m *Manager) worker() {
	defer m.life.wg.Done()
	for {
		select {
		case <-m.life.stop:
			return
		case run := <-m.life.ready:
			run()
		}
	}
}

// flush sends one lease call for every pending entry of sh, in one
// pipeline, and installs the grants.
func (m *Manager) flush(sh *stripe) {
	sh.mu.Lock()
	batch := sh.pending
	sh.pending, sh.spare = sh.spare[:0], nil
	rnd := sh.next
	sh.next, sh.flushing = nil, rnd
	for _, p := range batch {
		p.e.flags.Store(flagFlushing)
	}
	sh.mu.Unlock()

	sent := m.clock.Now()
	groups := make([]Group, len(batch))
	lims := make([]*Limit, len(batch))
	for i, p := range batch {
		lim := p.e.lim.Load()
		lims[i] = lim
		want := m.size(p.e.held.Load(), lim, sent, p.need, p.want)
		groups[i] = Group{{Key: lim.key(p.e.subject), Spec: lim.spec, Need: p.need, Want: want}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.CallTimeout)
	res, err := m.src.Lease(ctx, groups)
	cancel()
	m.stats.calls.Add(1)
	m.stats.groups.Add(int64(len(groups)))
	if err == nil && len(res) != len(groups) {
		err = fmt.Errorf("lease: source answered %d groups for %d", len(res), len(groups))
	}
	var errs []error
	if err != nil {
		errs = append(errs, err)
	} else {
		for i, p := range batch {
			if res[i].Err != nil {
				errs = append(errs, res[i].Err)
				continue
			}
			m.apply(p, lims[i], sent, res[i])
		}
	}

	sh.mu.Lock()
	for _, p := range batch {
		p.e.flags.Store(0)
	}
	clear(batch)
	sh.spare = batch[:0]
	sh.flushing = nil
	if len(sh.pending) > 0 {
		m.dispatch(sh)
	} else {
		sh.scheduled = false
	}
	sh.mu.Unlock()

	if len(errs) > 0 {
		rnd.err = fmt.Errorf("lease: refill: %w", errors.Join(errs...))
		// A line per round while a shard is down or the node sheds:
		// Options.Logger is rate-limited.
		m.log.Warn("lease refill failed", "keys", len(batch), "err", rnd.err)
	}
	close(rnd.done)
}

// size updates e's rate estimate and returns the grant to ask for. After
// a paced answer (denyTil set) the grant is capped at this node's part of
// what gathered since its last grant (PacedWant).
//
// want is a batch taker's size (TakeUpTo's most): the grant is at least
// that, up to the capacity. Neither MaxShare nor the paced part caps it:
// the batch is already one client's fair part of the rate for one of its
// rounds, and either cap would hold a lone client to MaxShare of the rate.
func (m *Manager) size(e *held, lim *Limit, now, need, want int64) int64 {
	_, old, cur := e.live(now)
	ce := e.curExp.Load()
	var since time.Duration
	if ce != 0 {
		since = time.Duration(now - (ce - int64(lim.cfg.TTL)))
		consumed := int64(e.lastHand) - (old + cur)
		e.rate = float32(EstimateRate(float64(e.rate), consumed, since, lim.cfg.TargetPeriod/10))
	}
	size := GrantSize(float64(e.rate), lim.cfg, lim.capacity, need)
	if ce != 0 && e.denyTil.Load() != 0 && e.bucket > 0 {
		_, alone := e.sinceAnswered(now)
		size = PacedWant(lim.cfg, float64(e.bucket), since, size, need, alone)
	}
	return max(size, min(want, lim.capacity, maxGrant))
}

// apply installs one lease answer into its entry.
func (m *Manager) apply(p refill, lim *Limit, sent int64, r Reply) {
	g := r.Items[0]
	e := p.e.held.Load() // made when it was queued
	now := m.clock.Now()
	// Alone on the bucket since the last answer? Not known before one,
	// never while RLQS parts hold it.
	alone := false
	if e.bucket > 0 && !g.Shared {
		gap, _ := e.sinceAnswered(sent)
		alone = Alone(int64(e.left.Load()), gap, min(float64(e.bucket), g.Rate), g.Burst, g.Left+g.Granted)
	}
	e.setAnswered(now, alone)
	e.left.Store(int32(min(g.Left, math.MaxInt32)))
	e.bucket = float32(g.Rate)
	// Pacing: when the bucket is left without a useful grant for this
	// node, the next refill waits until this node's part of the rate has
	// gathered one; requests meanwhile are denied from memory.
	pace := func(retry time.Duration) int64 {
		d := Pace(lim.cfg, g.Rate, g.Burst, g.Left, float64(e.rate), alone, retry)
		if d <= 0 {
			return 0
		}
		return now + int64(d)
	}
	if !r.Granted {
		if g.RetryAfter < 0 { // a coordinator share smaller than the cost
			e.denyTil.Store(now + int64(lim.cfg.TTL))
		} else {
			e.denyTil.Store(max(pace(g.RetryAfter), now+1))
		}
		m.stats.denials.Add(1)
		return
	}
	m.stats.granted.Add(g.Granted)
	deny := pace(0)
	if deny != 0 {
		m.stats.paced.Add(1)
	}
	e.denyTil.Store(deny)
	if g.Granted == 0 {
		return
	}
	onHand := e.install(now, sent+int64(lim.cfg.TTL), g.Granted)
	e.lastHand = int32(min(onHand, math.MaxInt32))
	e.wm.Store(int32(min(Watermark(lim.cfg, g.Granted), maxGrant)))
}
