package lease

import "sync/atomic"

// The cold filter is set-associative: a key's hash picks a bucket of
// coldWays cells, one cache line; the bucket's first cell counts its
// overflow (below), the others each track one key. 8,192 buckets: 512
// KiB per Manager with Options.ColdExact, and 57,344 key cells, more
// than the keys one node checks exactly within a window of 1 s.
const (
	coldBucketBits = 13
	coldBuckets    = 1 << coldBucketBits
	coldWays       = 8
)

// Key cell layout, low bits first: the key's Takes in its current
// window (8 bits), the tracked keys holding lease state that pinned the
// cell (8 bits), the key's fingerprint (16 bits), and the window's start
// (clock ns >> 16, 32 bits: 65.5 µs steps, wrapping every 78 hours).
const (
	cellHits    = 0xff
	cellPins    = 0xff << 8
	cellOnePin  = 1 << 8
	cellPrintAt = 16
	cellStartAt = 32
	cellStep    = 16 // log2 of the window start's unit in ns
)

// coldFilter answers "cold" for a key not leased here without looking
// the key up: the Takes of the cold keys of a large key set, all sent to
// the exact path, would otherwise each walk the key table and load the
// key's entry and subject (cache misses on one of thousands of keys, for
// an answer that is "exact" anyway), and each such key would cost an
// entry.
//
// A key cell counts the Takes of one key in a window of half the lease
// TTL, as entry.seen does in the key table (Manager.cold): while the
// count is under ColdHits the Take is cold; the Take that reaches it
// makes the key warm, and the key table takes the key over and leases.
// A key is known in its bucket by a 16-bit fingerprint of its hash; it
// claims a cell that is free or whose window has ended, or else one
// whose key was seen only once in its window (which forgets that key).
// When all of its bucket's cells belong to other keys seen more often,
// the key is not counted here: its Takes go to the key table, whose
// per-key count judges them as before the filter. So every key is counted on its
// own (but for two keys of one bucket with one fingerprint, 1 in 65,536
// per pair: they warm together), and the filter only takes the lookup
// off the common case.
//
// A key that holds lease state (a held: leased, refilling or paced)
// pins a cell (or, in a bucket full of others, raises the bucket's
// overflow count): every Take of a pinned key, and of any key of a
// bucket with overflow, goes to the key table, so a leased key keeps its
// lease, its refills and its deny cache, and is judged cold only by
// Manager.cold. The pin is made when the key's held is made and undone
// when the key is evicted.
type coldFilter struct {
	// A large allocation starts on a page, so every bucket is one cache
	// line.
	cells [coldBuckets * coldWays]atomic.Uint64
}

// coldBucket is the first cell of hash h's bucket, from the high bits of
// the low half of the hash, which an entry keeps (entry.hash). The key
// table's slot comes from the low bits, its stripe from the high half.
func coldBucket(h uint32) uint32 { return h >> (32 - coldBucketBits) * coldWays }

// coldPrint is hash h's fingerprint, from bits the bucket does not use.
func coldPrint(h uint32) uint64 { return uint64(h>>3) & 0xffff }

// bucket returns hash h's bucket and fingerprint.
func (f *coldFilter) bucket(h uint32) ([]atomic.Uint64, uint64) {
	return f.cells[coldBucket(h):][:coldWays], coldPrint(h)
}

// owns reports whether key cell c belongs to the key with fingerprint fp:
// it counts that key's Takes or holds its pins.
func owns(c, fp uint64) bool { return c>>cellPrintAt&0xffff == fp && c&(cellHits|cellPins) != 0 }

// filterAnswer is what the cold filter says of a Take.
type filterAnswer int

const (
	filterCold  filterAnswer = iota // under ColdHits: exact
	filterWarm                      // the Take that reached ColdHits: lease
	filterTable                     // pinned, overflow or no cell: ask the key table
)

// take counts a Take of the key with hash h at now (clock ns) in windows
// of half (ns).
func (f *coldFilter) take(h uint32, now, half int64, hits int) filterAnswer {
	b, fp := f.bucket(h)
	at := uint32(uint64(now) >> cellStep)
	span := half >> cellStep
	for {
		if b[0].Load() != 0 {
			return filterTable
		}
		free, once, next := -1, -1, uint64(at)<<cellStartAt|fp<<cellPrintAt|1
		var old, onceOld uint64
		for i := 1; i < coldWays; i++ {
			c := b[i].Load()
			live := c&cellHits != 0 && int64(at-uint32(c>>cellStartAt)) <= span
			if owns(c, fp) {
				if c&cellPins != 0 {
					return filterTable
				}
				free, old = i, c
				if live {
					next = c + min(1, cellHits-c&cellHits)
				}
				break
			}
			switch {
			case c&cellPins != 0:
			case !live:
				if free < 0 {
					free, old = i, c
				}
			case c&cellHits == 1 && once < 0:
				once, onceOld = i, c
			}
		}
		if free < 0 && once >= 0 {
			// A crowded bucket forgets a key seen once in its window
			// rather than send the newcomer to the key table: a warm key
			// is past one Take soon after its window opens, and a
			// forgotten one only counts again from one.
			free, old = once, onceOld
		}
		if free < 0 {
			return filterTable
		}
		if b[free].CompareAndSwap(old, next) {
			if int(next&cellHits) < hits {
				return filterCold
			}
			return filterWarm
		}
	}
}

// hold pins a cell for the key with hash h, which now holds lease state,
// or counts it in its bucket's overflow.
func (f *coldFilter) hold(h uint32) {
	b, fp := f.bucket(h)
	for {
		pin, old := -1, uint64(0)
		for i := 1; i < coldWays; i++ {
			c := b[i].Load()
			if owns(c, fp) {
				if c&cellPins != cellPins {
					pin, old = i, c
				}
				break
			}
			// A pin takes any unpinned cell: a cold key losing its
			// count only judges it colder.
			if pin < 0 && c&cellPins == 0 {
				pin, old = i, c
			}
		}
		if pin < 0 {
			b[0].Add(1)
			return
		}
		next := old + cellOnePin
		if !owns(old, fp) {
			next = fp<<cellPrintAt | cellOnePin
		}
		if b[pin].CompareAndSwap(old, next) {
			return
		}
	}
}

// release undoes the hold of an evicted key with hash h.
func (f *coldFilter) release(h uint32) {
	b, fp := f.bucket(h)
	for {
		pin, old := -1, uint64(0)
		for i := 1; i < coldWays; i++ {
			if c := b[i].Load(); owns(c, fp) && c&cellPins != 0 {
				pin, old = i, c
				break
			}
		}
		if pin < 0 {
			for {
				n := b[0].Load()
				if n == 0 || b[0].CompareAndSwap(n, n-1) {
					return
				}
			}
		}
		if b[pin].CompareAndSwap(old, old-cellOnePin) {
			return
		}
	}
}
