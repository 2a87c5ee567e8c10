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
// lease owns the tokens leased to this node, their keys' table, the
// refill rounds and the lease protocol it speaks to the region (Source:
// Item, Group, ItemReply, Reply, ReturnItem), and counts the demand of
// global keys for DrainDemand. It owns no wire format and no policy
// matching; it never blocks a decision on Redis while tokens are on hand,
// and never retries a lease call whose reply was lost (the grant is then
// simply stranded). What a deterministic simulation needs is an option:
// refill rounds on its event queue (Options.Executor, chosen once at New)
// and a fixed hash (Options.FixedHash, which the take path tests as a
// flag at each Take rather than calling a hash chosen at New: a hash
// called through a function value would move every caller's subject
// buffer to the heap).
package lease

import (
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
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
	// Logger receives the manager's warnings; nil discards them. A failed
	// refill round logs a line, and while a shard is down or the node
	// sheds load every round fails: give it a rate-limited logger (a
	// node passes internal/ratelog's), or an outage floods it.
	Logger *slog.Logger
}

// Manager holds leases for many keys. It is safe for concurrent use;
// Close stops its goroutines and returns unspent tokens; Abort (a crash)
// drops them.
type Manager struct {
	src      Source
	clock    Clock
	defaults Config
	opts     Options
	log      *slog.Logger
	seed     maphash.Seed
	// coldKeys counts the Takes of keys not leased here, so that a cold
	// key is sent to the exact path without being looked up (nil without
	// Options.ColdExact).
	coldKeys *coldFilter
	stripes  [nStripes]stripe
	life     lifecycle
	stats    counters
}

// lifecycle is what starts and stops a Manager: who runs refill rounds
// (the workers, fed through ready, or Options.Executor), the stop signal
// and the goroutines it ends, and the clock the manager made for itself
// (stopped at Close).
type lifecycle struct {
	// exec runs a stripe's flush: Options.Executor, or a hand-off to the
	// workers through ready.
	exec   func(run func())
	ready  chan func()
	stop   chan struct{}
	wg     sync.WaitGroup
	closed atomic.Bool
	once   sync.Once
	owned  *CoarseClock
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
		life:     lifecycle{exec: opts.Executor, ready: make(chan func(), nStripes), stop: make(chan struct{})},
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.clock == nil {
		m.life.owned = NewCoarseClock(DefaultTick)
		m.clock = m.life.owned
	}
	if opts.ColdExact {
		m.coldKeys = new(coldFilter)
	}
	for i := range m.stripes {
		sh := &m.stripes[i]
		sh.table.Store(newTable(8))
		sh.run = func() {
			if !m.life.closed.Load() {
				m.flush(sh)
			}
		}
	}
	if m.life.exec == nil {
		m.life.exec = func(run func()) { m.life.ready <- run }
	}
	for i := 0; i < opts.Workers && opts.Executor == nil; i++ {
		m.life.wg.Add(1)
		go m.worker()
	}
	if opts.SweepEvery > 0 {
		m.life.wg.Add(1)
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
