package lease

import (
	"context"
	"fmt"
	"time"
)

// Shutting down: Close returns what is on hand, Abort strands it.

// Close stops the refill workers and the sweeper, fails waiting requests
// with ErrClosed, and returns the unspent tokens of every live lease to
// the region (credited as return.lua decays them). ctx bounds the
// returns, as does CallTimeout. Take fails with ErrClosed afterwards.
func (m *Manager) Close(ctx context.Context) error {
	items, first := m.shutdown()
	if !first || len(items) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.CallTimeout)
	defer cancel()
	n, err := m.src.Return(ctx, items)
	m.stats.returned.Add(n)
	if err != nil {
		return fmt.Errorf("lease: close: %w", err)
	}
	return nil
}

// Abort stops the manager as a crash would, for chaos tests of a killed
// node: like Close it stops the refill workers and the sweeper and fails
// waiting requests with ErrClosed, but it drops the unspent tokens of
// every live lease instead of returning them. They stay debited from the
// region's buckets, stranded until their leases expire (the TTL term of
// the bound). It returns how many tokens it dropped; after Close or
// Abort it does nothing and returns 0. Take fails with ErrClosed
// afterwards.
func (m *Manager) Abort() (stranded int64) {
	items, _ := m.shutdown()
	for _, it := range items {
		stranded += it.Unspent
	}
	return stranded
}

// shutdown is the first Close or Abort: it stops the goroutines, fails
// waiting requests and drains every live lease into return items. first
// is false (and items nil) if the manager was already shut down.
func (m *Manager) shutdown() (items []ReturnItem, first bool) {
	m.life.once.Do(func() {
		first = true
		m.life.closed.Store(true)
		close(m.life.stop)
	})
	if !first {
		return nil, false
	}
	m.life.wg.Wait()
	now := m.clock.Now()
	for i := range m.stripes {
		sh := &m.stripes[i]
		sh.mu.Lock()
		for _, r := range []*round{sh.next, sh.flushing} {
			if r != nil {
				r.err = ErrClosed
				close(r.done)
			}
		}
		sh.next, sh.flushing, sh.pending = nil, nil, nil
		t := sh.table.Load()
		for j := range t.slots {
			if e := t.slots[j].Load(); e != nil {
				items = m.returns(items, e, now)
			}
		}
		sh.mu.Unlock()
	}
	if m.life.owned != nil {
		m.life.owned.Stop()
	}
	return items, true
}

// returns drains e's live tokens into return items, one per generation,
// each with the age of its lease (from its expiry and the TTL; the old
// generation uses its earliest grant, which only makes it look older).
func (m *Manager) returns(items []ReturnItem, e *entry, now int64) []ReturnItem {
	hd := e.held.Load()
	if hd == nil {
		return items // never leased
	}
	old, cur := hd.drain(now)
	lim := e.lim.Load()
	ttl := int64(lim.cfg.TTL)
	for _, g := range [...]struct{ n, exp int64 }{{old, hd.oldExp.Load()}, {cur, hd.curExp.Load()}} {
		if g.n > 0 {
			items = append(items, ReturnItem{
				Key: lim.key(e.subject), Spec: lim.spec, Unspent: g.n, Age: time.Duration(max(0, now-(g.exp-ttl))),
			})
		}
	}
	return items
}
