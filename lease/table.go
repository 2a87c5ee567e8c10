package lease

import (
	"sync"
	"sync/atomic"
)

// stripeBits sets the stripe count. Stripes split the write side (inserts,
// evictions, refill queues); reads never lock.
const (
	stripeBits = 8
	nStripes   = 1 << stripeBits
)

// table is an open-addressing hash table with linear probing, read without
// locks: a reader loads the table pointer and probes slots with atomic
// loads. Writers hold the stripe's mutex; they only fill empty slots, and
// grow or evict by building a new table and swapping the pointer. A reader
// on an old table can miss a key or find an evicted one; both send it to
// the locked slow path, which looks again.
type table struct {
	mask  uint64 // below 2^32: entries keep the low half of their hash
	slots []atomic.Pointer[entry]
}

func newTable(size int) *table {
	return &table{mask: uint64(size - 1), slots: make([]atomic.Pointer[entry], size)}
}

// find returns the entry of (lim, subject) with hash h, or nil. The load
// factor stays <= 3/4, so an empty slot ends every probe.
func (t *table) find(h uint64, lim *Limit, subject []byte) *entry {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].Load()
		if e == nil {
			return nil
		}
		if e.hash == uint32(h) && e.subject == string(subject) && e.sameLimit(lim) {
			return e
		}
	}
}

// sameLimit reports whether e is lim's entry. A reloaded policy set brings
// new *Limit values for the same keys: the entry adopts the new one.
func (e *entry) sameLimit(lim *Limit) bool {
	cur := e.lim.Load()
	if cur == lim {
		return true
	}
	if cur.id != lim.id {
		return false
	}
	e.lim.Store(lim)
	return true
}

// put places e in an empty slot. The caller holds the stripe lock and has
// made room.
func (t *table) put(e *entry) {
	for i := uint64(e.hash) & t.mask; ; i = (i + 1) & t.mask {
		if t.slots[i].Load() == nil {
			t.slots[i].Store(e)
			return
		}
	}
}

// stripe is one part of the key space with its refill queue.
type stripe struct {
	table atomic.Pointer[table]

	mu        sync.Mutex
	n         int      // entries in table
	pending   []refill // entries waiting for the next refill call
	next      *round   // the round pending entries will be served in
	flushing  *round   // the round in a refill call now, if any
	scheduled bool     // in Manager.ready or being flushed
	spare     []refill // reused pending buffer
	run       func()   // flushes the stripe: what Options.Executor or a worker runs
	_         [40]byte // keep hot stripes off each other's cache lines
}

// refill is one entry's place in a refill round; need is the largest
// cost a request is waiting for (0 for a background refill).
type refill struct {
	e    *entry
	need int64
	want int64 // a batch taker's size (Manager.size); 0 for none
}

// round is one refill call of a stripe; waiters block on done.
type round struct {
	done chan struct{}
	err  error
}

// insert returns the live entry of (lim, subject), creating it; a
// global-scope key's held is made at once and counted in the cold filter
// f (if any). Called with sh.mu held.
func (sh *stripe) insert(h uint64, lim *Limit, subject []byte, f *coldFilter) *entry {
	t := sh.table.Load()
	if e := t.find(h, lim, subject); e != nil && e.flags.Load()&flagDead == 0 {
		return e
	}
	if (sh.n+1)*4 > len(t.slots)*3 {
		t = sh.rebuild(len(t.slots)*2, nil)
	}
	e := &entry{hash: uint32(h), subject: string(subject)}
	e.lim.Store(lim)
	if lim.global {
		// Its demand is counted from the first Take (DrainDemand).
		e.holdLocked(lim, f)
	}
	t.put(e)
	sh.n++
	return e
}

// rebuild copies the live entries for which keep is true (all if keep is
// nil) into a new table of size slots and publishes it.
func (sh *stripe) rebuild(size int, keep func(*entry) bool) *table {
	old := sh.table.Load()
	n := 0
	for i := range old.slots {
		if e := old.slots[i].Load(); e != nil && (keep == nil || keep(e)) {
			n++
		}
	}
	for size > 8 && n*4 < size { // shrink after evictions, keep load >= 1/4
		size /= 2
	}
	t := newTable(size)
	for i := range old.slots {
		if e := old.slots[i].Load(); e != nil && (keep == nil || keep(e)) {
			t.put(e)
		}
	}
	sh.n = n
	sh.table.Store(t)
	return t
}
