// Package lease is the node-local lease manager of `precision: leased`
// policies: it holds batches of tokens leased from the region's buckets
// in Redis and decides from them in memory.
//
// A decision (Take) is a lock-free hash-table lookup and a CAS on the
// key's token count: no lock, no allocation, no syscall, no Redis. When
// the tokens on hand fall to the low watermark, one asynchronous refill
// per key is queued; the refills of a stripe are sent as one pipeline.
// Only a request that finds no tokens at all waits, for the refill it
// joins. A key whose region bucket is left without a useful grant is
// paced: once its tokens on hand are spent it is denied locally, and not
// refilled, until this node's part of the rate has gathered one (Pace;
// the deny cache). With Options.ColdExact a key too cold to use a grant
// before it expires is not leased: Take tells the caller to decide it on
// the exact path.
//
// Every grant's tokens may be spent for TTL after the lease call was
// sent; then they are void. With the decayed credit of returns
// (lua/return.lua) that gives, for every window of length T, admitted <=
// burst + rate*(T + TTL + tick) for the whole region, whatever the
// number of nodes: ARCHITECTURE.md ("The overshoot bound") states the
// assumptions, docs/algorithms.md ("Leasing: proof of the overshoot bound")
// the proof.
//
// lease owns no wire format and no policy matching; it never blocks a
// decision on Redis while tokens are on hand, and never retries a lease
// call whose reply was lost (the grant is then simply stranded).
package lease

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// ErrClosed is returned by Take after Close.
var ErrClosed = errors.New("lease: manager closed")

// ErrWaitTimeout is returned by Take only when its refill round outlived
// the safety cap Options.MaxWait: the Source did not end a call within
// its CallTimeout. A healthy but busy node never returns it.
var ErrWaitTimeout = errors.New("lease: refill took longer than the wait bound")

// waitAborted is the error of a Take whose caller stopped waiting for its
// refill (ctx ended). The store did not fail, so it is marked as overload
// (decide.IsOverloaded), as region marks a call its caller stopped
// waiting for, and is not decided by on_store_failure.
type waitAborted struct{ err error }

func (w waitAborted) Error() string { return "lease: waiting for a refill: " + w.err.Error() }

func (w waitAborted) Unwrap() error { return w.err }

// Overloaded marks the error for decide.IsOverloaded.
func (waitAborted) Overloaded() bool { return true }

// DefaultCallTimeout bounds one lease or return call when
// Options.CallTimeout is zero (a node's --redis-lease-timeout). Refills
// are asynchronous and a stalled shard fails them by region's stall rule,
// so it is only a backstop for a busy node.
const DefaultCallTimeout = time.Second

// Bounds of Options.MaxWait, the safety cap on a waiting Take.
const (
	// MinMaxWait is the smallest cap: below it a cap would fire on a
	// healthy node whose refill waits behind others for a worker or is
	// slow to be scheduled (a 4 ms cap failed 3.7-23.5 % of leased
	// decisions under load on a healthy Redis; issue 12).
	MinMaxWait = 500 * time.Millisecond
	// DefaultColdHits is Config.ColdHits when zero.
	DefaultColdHits = 16
)

// Options configure a Manager.
type Options struct {
	// Source is the region store. Required.
	Source Source
	// Clock is read on every decision; nil means a CoarseClock of
	// DefaultTick owned (and stopped) by the manager.
	Clock Clock
	// Defaults fill the knobs a Limit leaves zero; zero fields here take
	// the package defaults.
	Defaults Config
	// IdleAfter evicts a key this long after its last lease expired and
	// its deny cache ended. Zero means 30s.
	IdleAfter time.Duration
	// SweepEvery is how often idle keys are looked for. Zero means 5s;
	// negative disables the sweeper (tests call Sweep).
	SweepEvery time.Duration
	// Workers is how many refill calls may run at once. Zero means 2.
	Workers int
	// CallTimeout is the deadline of one lease or return call (the
	// Source obeys its ctx; it has none of its own). Zero means
	// DefaultCallTimeout.
	CallTimeout time.Duration
	// MaxWait is a safety cap, not a latency budget. A Take with no
	// tokens on hand waits for the refill round it joined to end (granted,
	// denied, or failed with the Source's error, which the caller decides
	// by on_store_failure) or for its ctx. Every round ends within
	// CallTimeout of being sent, so the cap only fires for a Source that
	// ignores its call's context; the Take then fails with ErrWaitTimeout.
	// Zero means 2 x CallTimeout; a value below MinMaxWait is raised to it
	// (it once was a per-call budget of a few ms, which failed waits on a
	// merely busy node). A Take whose ctx ends sooner (a decision's
	// budget, decide.Config.Timeout) is bounded by its ctx alone.
	MaxWait time.Duration
	// ColdExact sends the Takes of cold keys to the exact path instead of
	// leasing for them: a Take that finds no live tokens, no refill under
	// way and no deny cache, on a key not leased within half its lease
	// TTL and not yet checked ColdHits times within a window of half its
	// TTL, answers Result.Exact and takes nothing. Such a key's grant
	// would be a token or two (the rate it shows times the target period)
	// and its lease close to expiry at its next request, so leasing would
	// cost it about a lease call per decision, where its exact check
	// shares one script call with the other checks of its round trip
	// (docs/performance.md, "Warm keys"). Global-scope limits too: the
	// exact path reports their demand (decide's DrainDemand), and a
	// global key spread thin over many nodes strands what each lease
	// holds (docs/simulation.md, "After a shift"). Cold keys are
	// counted in a 512 KiB filter, not in the key table (Stats.Keys), so a
	// large cold key set costs no entries.
	ColdExact bool
	// Executor, when set, runs refill rounds instead of the Workers
	// goroutines: the manager hands it each stripe's flush as run, which it
	// must call exactly once, later (never from inside Executor: the stripe
	// lock is held). A deterministic simulation (internal/tools/sim) queues run
	// on its virtual-time event queue, so no goroutine scheduling decides
	// when a refill is sent. Close and Abort must not be called while a run
	// is in progress; a run called after them does nothing.
	Executor func(run func())
	// FixedHash hashes subjects with a fixed function instead of a
	// per-process random seed, so which keys share a stripe (and so a
	// refill round) is the same in every run: a simulation's outcome must
	// not depend on it. Not for serving: a known hash lets a client pick
	// subjects that crowd one stripe.
	FixedHash bool
	Logger    *slog.Logger
}

// Manager holds leases for many keys. It is safe for concurrent use;
// Close stops its goroutines and returns unspent tokens; Abort (a crash)
// drops them.
type Manager struct {
	src      Source
	clock    Clock
	owned    *CoarseClock
	defaults Config
	opts     Options
	log      *slog.Logger
	seed     maphash.Seed
	// coldKeys counts the Takes of keys not leased here, so that a cold
	// key is sent to the exact path without being looked up (nil without
	// Options.ColdExact).
	coldKeys *coldFilter
	stripes  [nStripes]stripe
	ready    chan int
	stop     chan struct{}
	wg       sync.WaitGroup
	closed   atomic.Bool
	once     sync.Once
	stats    counters
	// failedRounds counts failed refill rounds since the last warning,
	// logged at lastWarn (unix ns; see warnFailed).
	failedRounds, lastWarn atomic.Int64
}

type counters struct {
	calls, groups, granted, denials, paced, exact, returned, evicted, stranded atomic.Int64
}

// Stats are counts since the manager started, for benchmarks and metrics.
type Stats struct {
	Keys     int   // keys tracked now (not the cold keys the cold filter counts)
	Calls    int64 // lease round trips (one pipeline each)
	Groups   int64 // lease script calls
	Granted  int64 // tokens granted
	Denials  int64 // lease calls the region could not serve (deny cache set)
	Paced    int64 // grants after which the key's next refill was paced (Pace)
	Exact    int64 // Takes of cold keys sent to the exact path (Options.ColdExact)
	Returned int64 // tokens credited back to the region by returns
	Evicted  int64 // idle keys evicted
	Stranded int64 // tokens given back by the caller that had nowhere safe to go
}

// New starts a manager.
func New(opts Options) (*Manager, error) {
	if opts.Source == nil {
		return nil, errors.New("lease: no Source")
	}
	d := opts.Defaults.Or(Defaults())
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("lease: defaults: %w", err)
	}
	if opts.IdleAfter <= 0 {
		opts.IdleAfter = 30 * time.Second
	}
	if opts.SweepEvery == 0 {
		opts.SweepEvery = 5 * time.Second
	}
	if opts.Workers <= 0 {
		opts.Workers = 2
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = 2 * opts.CallTimeout
	}
	opts.MaxWait = max(opts.MaxWait, MinMaxWait)
	m := &Manager{
		src:      opts.Source,
		clock:    opts.Clock,
		defaults: d,
		opts:     opts,
		log:      opts.Logger,
		seed:     maphash.MakeSeed(),
		ready:    make(chan int, nStripes),
		stop:     make(chan struct{}),
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.clock == nil {
		m.owned = NewCoarseClock(DefaultTick)
		m.clock = m.owned
	}
	if opts.ColdExact {
		m.coldKeys = new(coldFilter)
	}
	for i := range m.stripes {
		m.stripes[i].table.Store(newTable(8))
		m.stripes[i].idx = i
	}
	for i := 0; i < opts.Workers && opts.Executor == nil; i++ {
		m.wg.Add(1)
		go m.worker()
	}
	if opts.SweepEvery > 0 {
		m.wg.Add(1)
		go m.sweeper(opts.SweepEvery)
	}
	return m, nil
}

// Limit is one leased limit: the bucket maths and knobs shared by every
// key of a policy limit. Make one per compiled limit with NewLimit and
// reuse it; a new Limit with the same key function (a policy reload)
// takes over the old one's keys.
type Limit struct {
	key      func(subject string) string
	id       string
	mix      uint64
	spec     algorithm.Spec
	cfg      Config
	global   bool
	capacity int64
	rate     float64
	// nsPerToken is 1e9/rate: the refill time of one token.
	nsPerToken float64
}

// NewLimit describes a leased limit. key builds the Redis key of a subject
// (policy.CompiledLimit.Key); spec must be a token bucket; cfg's zero
// knobs take the manager's defaults; global marks a global-scope limit,
// whose demand DrainDemand reports.
func (m *Manager) NewLimit(key func(subject string) string, spec algorithm.Spec, cfg Config, global bool) (*Limit, error) {
	if spec.Algorithm != algorithm.TokenBucket || spec.Limit <= 0 || spec.Period <= 0 {
		return nil, fmt.Errorf("lease: %s: only token buckets with a positive limit and period can be leased", key("…"))
	}
	cfg = cfg.Or(m.defaults)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("lease: %s: %w", key("…"), err)
	}
	id := key("")
	return &Limit{
		key: key, id: id, mix: m.hash([]byte(id)), spec: spec, cfg: cfg, global: global,
		capacity: spec.Capacity(), rate: spec.Rate(), nsPerToken: 1e9 / spec.Rate(),
	}, nil
}

// hash is a subject's (or a limit id's) hash: maphash with the manager's
// seed, or with Options.FixedHash an FNV-1a finished by a 64-bit mixer
// (the stripe is taken from the top bits, which FNV alone spreads badly).
func (m *Manager) hash(b []byte) uint64 {
	if m.opts.FixedHash {
		return fixedHash(b)
	}
	return maphash.Bytes(m.seed, b)
}

// fixedHash is kept out of line: TakeTo's straight path stays short.
//
//go:noinline
func fixedHash(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	return h ^ h>>33
}

// Config returns the limit's knobs, defaults filled in.
func (l *Limit) Config() Config { return l.cfg }

// Result is the answer of one Take.
type Result struct {
	Allowed bool
	// Limit is the bucket's capacity (the policy's burst).
	Limit int64
	// Remaining estimates the tokens left for this key in the region: those
	// on hand here plus what the region bucket held after this node's last
	// grant, capped at Limit. Other nodes' use since then is not seen.
	Remaining int64
	// ResetAfter is how long the region bucket would take to refill from
	// Remaining to Limit.
	ResetAfter time.Duration
	// RetryAfter is set on a denial: when the region bucket can give the
	// cost again (algorithm.Never if the cost exceeds the capacity).
	RetryAfter time.Duration
	// Exact says the key is cold (see Options.ColdExact): nothing was
	// taken, and the caller decides this request on the exact path.
	Exact bool

	h *held
	t ticket
}

// Take takes cost tokens for the key of lim and subject (the bytes of
// policy.Compiled.AppendSubject). With tokens on hand it neither locks nor
// allocates. With none it joins the key's refill and waits (ctx bounds
// the wait); a Redis failure is returned as an error, and the caller
// decides whether to fail open or closed. It is TakeTo with the Result
// returned.
func (m *Manager) Take(ctx context.Context, lim *Limit, subject []byte, cost int64) (Result, error) {
	var r Result
	err := m.TakeTo(ctx, lim, subject, cost, &r)
	return r, err
}

// TakeTo is Take with the Result written to *r (zeroed first; on an
// error it is left zero). The decision path uses it: a Result is nine
// words, too many to be returned in registers, and copying it back from
// the stack, field stores read by wider loads, cost a third of a leased
// decision (BenchmarkTake's profile).
//
// The common case, a tracked key with tokens on hand, is the straight
// path here: hash, lock-free probe, one CAS, the answer's numbers.
// Everything else (a new key, no tokens, a refill to wait for, the deny
// cache, a cold key) is takeSlow.
func (m *Manager) TakeTo(ctx context.Context, lim *Limit, subject []byte, cost int64, r *Result) error {
	if cost <= lim.capacity {
		var h uint64
		if m.opts.FixedHash { // not m.hash: that call would not be inlined
			h = fixedHash(subject)
		} else {
			h = maphash.Bytes(m.seed, subject)
		}
		h ^= lim.mix
		warm := false
		if f := m.coldKeys; f != nil && cost > 0 {
			// The cold filter judges a key not leased here without a lookup.
			switch f.take(uint32(h), m.clock.Now(), int64(lim.cfg.TTL)/2, lim.cfg.ColdHits) {
			case filterCold:
				m.stats.exact.Add(1)
				*r = Result{Limit: lim.capacity, Exact: true}
				return nil
			case filterWarm:
				warm = true
			}
		}
		sh := &m.stripes[h>>(64-stripeBits)]
		if e := sh.table.Load().find(h, lim, subject); e != nil {
			if hd := e.held.Load(); hd != nil {
				now := m.clock.Now()
				if t, rest, ok := hd.take(now, cost); ok {
					m.allowed(sh, e, hd, lim, now, cost, rest, t, r)
					return nil
				}
			}
			return m.takeSlow(ctx, lim, subject, cost, 0, h, sh, e, warm, r)
		}
		return m.takeSlow(ctx, lim, subject, cost, 0, h, sh, nil, warm, r)
	}
	*r = Result{Limit: lim.capacity, RetryAfter: algorithm.Never}
	return nil
}

// allowed writes the answer of a take of cost that left rest on hand,
// and queues a refill when rest fell to the watermark. A paced key
// (denyTil ahead) spends what it holds and then is denied: its refill
// waits for the pace to end.
func (m *Manager) allowed(sh *stripe, e *entry, hd *held, lim *Limit, now, cost, rest int64, t ticket, r *Result) {
	if rest <= int64(hd.wm.Load()) && e.flags.Load() == 0 && now >= hd.denyTil.Load() {
		m.schedule(sh, e, 0, 0)
	}
	if hd.demand != nil {
		hd.demand.admitted.Add(cost)
	}
	rem := hd.remaining(lim, rest)
	// Field by field: a composite literal would be built on the stack and
	// copied, the copy TakeTo exists to avoid.
	r.Allowed = true
	r.Limit = lim.capacity
	r.Remaining = rem
	r.ResetAfter = lim.resetAfter(rem)
	r.RetryAfter = 0
	r.Exact = false
	r.h = hd
	r.t = t
}

// takeSlow is TakeTo off the straight path: e is the entry found (nil if
// none), h and sh the key's hash and stripe; warm says the cold filter
// has just judged the key warm (its Take reached ColdHits), so it leases
// without the key table's own count. want > 0 is a batch taker's
// (TakeUpTo): its refill is sized for want, and the deny cache does not
// stop it: the cache spares Redis a call per request, and a batch taker
// makes one per client round, which a pace as long as the round would
// leave with nothing (two clients at the same phase: the second would
// never be served). A pace its own refill set still stops it.
func (m *Manager) takeSlow(ctx context.Context, lim *Limit, subject []byte, cost, want int64, h uint64, sh *stripe, e *entry, warm bool, r *Result) error {
	*r = Result{}
	for attempt := 0; ; attempt++ {
		if e == nil {
			if m.closed.Load() {
				return ErrClosed
			}
			sh.mu.Lock()
			e = sh.insert(h, lim, subject, m.coldKeys)
			sh.mu.Unlock()
		}
		hd := e.held.Load()
		if hd == nil && cost <= 0 {
			// A take of nothing succeeds on an empty lease too.
			sh.mu.Lock()
			hd = e.holdLocked(lim, m.coldKeys)
			sh.mu.Unlock()
		}
		now := m.clock.Now()
		var t ticket
		var rest int64
		var ok bool
		if hd != nil {
			t, rest, ok = hd.take(now, cost)
		}
		if ok {
			m.allowed(sh, e, hd, lim, now, cost, rest, t, r)
			return nil
		}
		if m.closed.Load() {
			return ErrClosed
		}
		var deny int64
		if hd != nil {
			deny = hd.denyTil.Load()
		}
		if now < deny && (want == 0 || attempt > 0) || attempt >= 3 {
			var rem int64
			if hd != nil {
				if hd.demand != nil {
					hd.demand.denied.Add(cost)
				}
				rem = hd.remaining(lim, rest)
			}
			*r = Result{
				Limit: lim.capacity, Remaining: rem, ResetAfter: lim.resetAfter(rem),
				RetryAfter: time.Duration(max(deny-now, int64(time.Millisecond))),
			}
			return nil
		}
		if m.opts.ColdExact && attempt == 0 && !warm && m.cold(e, lim, now) {
			m.stats.exact.Add(1)
			*r = Result{Limit: lim.capacity, Exact: true}
			return nil
		}
		dead, err := m.await(ctx, sh, e, cost, want)
		if err != nil {
			return err
		}
		if dead {
			e = nil
		}
	}
}

// cold reports whether a Take of e that found no tokens should go to the
// exact path: no refill under way, no lease sent (nor a pace ended)
// within half the TTL, and fewer than ColdHits Takes in the key's current
// window of half the TTL. It counts the Take in e.seen: the window's start
// in the high bits, its Takes in the low 8 (the clock's 256 ns lost).
// Most cold keys never get here: the cold filter counts them the same way
// without an entry (coldFilter); this is the rule for the keys it sends
// to the key table (leased ones, and those of crowded buckets).
func (m *Manager) cold(e *entry, lim *Limit, now int64) bool {
	if e.flags.Load() != 0 {
		return false
	}
	half := int64(lim.cfg.TTL) / 2
	// A leased key stays warm while its last lease call (or the end of a
	// pace: a contended key whose pace outlasts TTL/2 is hot) is recent.
	if hd := e.held.Load(); hd != nil {
		last := hd.denyTil.Load()
		if ce := hd.curExp.Load(); ce != 0 {
			last = max(last, ce-int64(lim.cfg.TTL))
		}
		if last != 0 && now-last <= half {
			return false
		}
	}
	for {
		old := e.seen.Load()
		start, hits := old&^seenHits, old&seenHits
		next := now&^seenHits | 1
		if old != 0 && now-start <= half {
			next = old
			if hits < seenHits {
				next++
			}
		}
		if e.seen.CompareAndSwap(old, next) {
			return next&seenHits < int64(lim.cfg.ColdHits)
		}
	}
}

// seenHits masks the Take count in entry.seen.
const seenHits = 0xff

// MaxColdHits is the largest Config.ColdHits: the count a key's entry
// holds in its low 8 bits.
const MaxColdHits = seenHits

// GiveBack returns the tokens of an allowed Take to this node's lease,
// for a request another limit denied.
func (m *Manager) GiveBack(r *Result) {
	m.GiveBackPart(r, r.t.n)
	r.h = nil
}

// GiveBackPart returns n of the tokens an allowed Take (or TakeUpTo) took
// to this node's lease; the Result keeps the rest (Tokens).
func (m *Manager) GiveBackPart(r *Result, n int64) {
	n = min(n, r.t.n)
	if !r.Allowed || r.h == nil || n <= 0 {
		return
	}
	if !r.h.give(m.clock.Now(), ticket{n: n, exp: r.t.exp}) {
		m.stats.stranded.Add(n)
	}
	if d := r.h.demand; d != nil {
		d.admitted.Add(-n)
	}
	r.t.n -= n
}

// remaining is the honest Remaining of a Result: onHand plus what the
// region bucket held after the last grant, capped at the capacity.
func (e *held) remaining(lim *Limit, onHand int64) int64 {
	return min(lim.capacity, onHand+max(0, int64(e.left.Load())))
}

// resetAfter is the time the region bucket takes from rem to full.
func (l *Limit) resetAfter(rem int64) time.Duration {
	// A multiplication, not a division: this runs on every decision.
	return time.Duration(float64(l.capacity-rem)*l.nsPerToken + 0.999)
}

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
	if m.closed.Load() {
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

// dispatch hands sh's next flush to a worker, or to Options.Executor.
// The caller holds sh.mu.
func (m *Manager) dispatch(sh *stripe) {
	if ex := m.opts.Executor; ex != nil {
		ex(func() {
			if !m.closed.Load() {
				m.flush(sh)
			}
		})
		return
	}
	m.ready <- sh.idx
}

func (m *Manager) worker() {
	defer m.wg.Done()
	for {
		select {
		case <-m.stop:
			return
		case i := <-m.ready:
			m.flush(&m.stripes[i])
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
		m.warnFailed(len(batch), rnd.err)
	}
	close(rnd.done)
}

// warnEvery rate-limits the refill-failure warning: while a shard is down
// or the node sheds load every round fails, and a line per round would
// cost more than the round.
const warnEvery = 10 * time.Second

// warnFailed logs a failed refill round, at most once per warnEvery, with
// how many failed rounds the previous line left unsaid.
func (m *Manager) warnFailed(keys int, err error) {
	n := m.failedRounds.Add(1)
	now := time.Now().UnixNano()
	last := m.lastWarn.Load()
	if last != 0 && now-last < int64(warnEvery) || !m.lastWarn.CompareAndSwap(last, now) {
		return
	}
	m.failedRounds.Add(-n)
	m.log.Warn("lease refill failed", "keys", keys, "err", err, "failed_rounds", n)
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
		size = PacedWant(lim.cfg, float64(e.bucket), since, size, need)
	}
	return max(size, min(want, lim.capacity, maxGrant))
}

// apply installs one lease answer into its entry.
func (m *Manager) apply(p refill, lim *Limit, sent int64, r Reply) {
	g := r.Items[0]
	e := p.e.held.Load() // made when it was queued
	e.left.Store(int32(min(g.Left, math.MaxInt32)))
	e.bucket = float32(g.Rate)
	now := m.clock.Now()
	// Pacing: when the bucket is left without a useful grant for this
	// node, the next refill waits until this node's part of the rate has
	// gathered one; requests meanwhile are denied from memory.
	pace := func(retry time.Duration) int64 {
		d := Pace(lim.cfg, g.Rate, g.Burst, g.Left, float64(e.rate), retry)
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

func (m *Manager) sweeper(every time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
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

// Stats returns the manager's counters.
func (m *Manager) Stats() Stats {
	n := 0
	for i := range m.stripes {
		sh := &m.stripes[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return Stats{
		Keys: n, Calls: m.stats.calls.Load(), Groups: m.stats.groups.Load(), Granted: m.stats.granted.Load(),
		Denials: m.stats.denials.Load(), Paced: m.stats.paced.Load(), Exact: m.stats.exact.Load(), Returned: m.stats.returned.Load(), Evicted: m.stats.evicted.Load(),
		Stranded: m.stats.stranded.Load(),
	}
}

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
	m.once.Do(func() {
		first = true
		m.closed.Store(true)
		close(m.stop)
	})
	if !first {
		return nil, false
	}
	m.wg.Wait()
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
	if m.owned != nil {
		m.owned.Stop()
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
