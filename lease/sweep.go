package lease

import (
	"time"
)

// The sweeper: idle keys evicted, and the demand counts the coordinator
// drains.

func (m *Manager) sweeper(every time.Duration) {
	defer m.life.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.life.stop:
			return
		case <-t.C:
			m.Sweep()
		}
	}
}

// Sweep evicts idle keys: no live lease and no deny cache for IdleAfter.
// The sweeper goroutine calls it every SweepEvery; tests call it directly.
func (m *Manager) Sweep() {
	now := m.clock.Now()
	idle := int64(m.opts.IdleAfter)
	for i := range m.stripes {
		sh := &m.stripes[i]
		sh.mu.Lock()
		t := sh.table.Load()
		evicted := 0
		for j := range t.slots {
			e := t.slots[j].Load()
			if e == nil || e.flags.Load() != 0 {
				continue
			}
			last := e.seen.Load()
			if hd := e.held.Load(); hd != nil {
				last = max(last, hd.curExp.Load(), hd.denyTil.Load())
			}
			if now >= last+idle {
				e.flags.Store(flagDead)
				evicted++
				if e.held.Load() != nil && m.coldKeys != nil {
					m.coldKeys.release(e.hash)
				}
			}
		}
		if evicted > 0 {
			sh.rebuild(len(t.slots), func(e *entry) bool { return e.flags.Load()&flagDead == 0 })
			m.stats.evicted.Add(int64(evicted))
		}
		sh.mu.Unlock()
	}
}

// DrainDemand calls fn for every tracked global-scope key that saw
// traffic since the last drain, with the tokens admitted and denied here
// since then, and resets those counts. The coordinator reads it to share
// global limits between regions. fn must not call the manager.
func (m *Manager) DrainDemand(fn func(key string, admitted, denied int64)) {
	for i := range m.stripes {
		t := m.stripes[i].table.Load()
		for j := range t.slots {
			e := t.slots[j].Load()
			if e == nil {
				continue
			}
			hd := e.held.Load()
			if hd == nil || hd.demand == nil {
				continue
			}
			a, d := hd.demand.admitted.Swap(0), hd.demand.denied.Swap(0)
			if a != 0 || d != 0 {
				fn(e.lim.Load().key(e.subject), a, d)
			}
		}
	}
}
