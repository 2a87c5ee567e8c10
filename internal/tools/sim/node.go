package sim

import (
	"context"
	"errors"
	"iter"
	"strconv"
	"strings"

	"github.com/allot-dev/allot/internal/fallback"
	"github.com/allot-dev/allot/lease"
)

// node is one Allot node: a real lease.Manager whose refills run on the
// event queue (lease.Options.Executor) and whose Source answers through
// the region's simulated Redis after a round trip.
type node struct {
	s     *Sim
	reg   *region
	idx   int
	m     *lease.Manager
	lim   *lease.Limit
	alive bool
	// gen counts the node's crashes: what a process that died had under
	// way is dropped when it ends, even if the node is back (Restart).
	gen int
	// clockOff is the node's clock offset (Skew.Node), kept positive.
	clockOff int64
	// fb decides on_store_failure: local while the region's Redis is down
	// (nil for the other modes).
	fb *fallback.Store
	// exactDemand is the tokens the exact path's checks admitted and
	// denied since the last publish, per key index.
	exactDemand map[int][2]int64
	// waiters are the requests that found no tokens and wait for their
	// key's refill: per key, each one's attempts so far.
	waiters  map[int][]uint8
	inflight []*call
	// grants are the node's grants per key index, oldest first, each
	// with what of it no leased admission has yet been counted against:
	// the check of the bound's assumption 1 (grantAge).
	grants map[int][]grant
}

// grant is tokens a lease call brought a node, spendable until exp (ns:
// the call's sending plus Config.TTL and the bound's δ).
type grant struct {
	exp, n int64
}

// spent counts one leased admission of key k on the node against its
// grants, oldest first, as the manager spends them (a token outlives
// neither its own grant's TTL nor, merged, an older one's): one that
// finds no grant of the last TTL breaks the overshoot bound's assumption
// 1 (ARCHITECTURE.md: every leased admission spends a token of a grant
// asked for at most TTL earlier), which no window of the bound may show.
func (nd *node) spent(k int) {
	gs := nd.grants[k]
	now := nd.s.now
	for len(gs) > 0 && (gs[0].exp < now || gs[0].n == 0) {
		gs = gs[1:]
	}
	if len(gs) == 0 {
		nd.s.met.pastTTL++
	} else {
		gs[0].n--
	}
	nd.grants[k] = gs
}

// call is one refill round (Manager.flush) running on a coroutine: it
// suspends inside Source.Lease until the simulated reply arrives, so the
// manager's own code runs unchanged and nothing runs concurrently.
type call struct {
	nd      *node
	w       *worker
	keys    []int
	replies []lease.Reply
	err     error // the Lease call's: a crash, or the store being down
	failed  bool  // the node crashed: the reply is not delivered
}

// worker is a coroutine (iter.Pull) that runs refill rounds one after
// another; idle ones are reused, so their stacks are grown once.
type worker struct {
	next  func() (struct{}, bool)
	stop  func()
	yield func(struct{}) bool
	job   func()
	done  bool // the job returned (else it is suspended in Lease)
}

func (s *Sim) worker() *worker {
	if n := len(s.idle); n > 0 {
		w := s.idle[n-1]
		s.idle = s.idle[:n-1]
		return w
	}
	w := &worker{}
	w.next, w.stop = iter.Pull(func(yield func(struct{}) bool) {
		w.yield = yield
		for {
			w.job()
			w.done = true
			if !yield(struct{}{}) {
				return
			}
		}
	})
	s.workers = append(s.workers, w)
	return w
}

// stopWorkers ends every coroutine (the end of a run).
func (s *Sim) stopWorkers() {
	for _, w := range s.workers {
		w.stop()
	}
	s.workers, s.idle = nil, nil
}

// maxAttempts is how often a waiting request re-waits before it is denied
// (Manager.takeSlow gives up after as many refill rounds).
const maxAttempts = 3

var errCrashed = errors.New("sim: node crashed")

// execute is the manager's Executor: the flush runs as its own event.
func (nd *node) execute(run func()) {
	gen := nd.gen
	nd.s.q.push(nd.s.now, func() {
		if !nd.alive || nd.gen != gen {
			return
		}
		c := &call{nd: nd, w: nd.s.worker()}
		c.w.job, c.w.done = run, false
		nd.s.resume(c)
	})
}

// resume runs c until it suspends in Lease or its round ends; then the
// requests waiting for its keys try again.
func (s *Sim) resume(c *call) {
	prev := s.cur
	s.cur = c
	c.w.next()
	s.cur = prev
	if !c.w.done {
		return // suspended in Lease
	}
	c.w.job = nil
	s.idle = append(s.idle, c.w)
	nd := c.nd
	for i, x := range nd.inflight {
		if x == c {
			nd.inflight = append(nd.inflight[:i], nd.inflight[i+1:]...)
			break
		}
	}
	if !nd.alive {
		return
	}
	for _, k := range c.keys {
		ws := nd.waiters[k]
		if ws == nil {
			continue
		}
		delete(nd.waiters, k)
		for _, a := range ws {
			if c.err != nil {
				// The refill they waited for failed: a real take returns
				// its error, and the request is decided by on_store_failure.
				nd.storeFailed(k)
				continue
			}
			nd.take(k, a)
		}
	}
}

// take decides one request for key k on this node; attempts counts the
// refills it already waited for.
func (nd *node) take(k int, attempts uint8) {
	s := nd.s
	var r lease.Result
	err := nd.m.TakeTo(s.expired, nd.lim, s.subjects[k], 1, &r)
	switch {
	case err == nil && r.Exact:
		nd.exact(k)
	case err == nil:
		if r.Allowed {
			nd.spent(k)
		}
		s.met.decided(nd.reg.idx, k, s.now, verdictOf(r.Allowed))
	case errors.Is(err, context.DeadlineExceeded) && attempts+1 < maxAttempts:
		// No tokens on hand: the refill is queued; wait for it.
		if nd.waiters == nil {
			nd.waiters = map[int][]uint8{}
		}
		nd.waiters[k] = append(nd.waiters[k], attempts+1)
	default:
		s.met.decided(nd.reg.idx, k, s.now, refused)
	}
}

// exact decides one request for cold key k on the exact path: check.lua
// on the region bucket, a round trip away. Its demand is published with
// the leases'. A node that crashed meanwhile never answers (denied); what
// the script took stays taken.
func (nd *node) exact(k int) {
	s := nd.s
	s.met.exactCalls++
	gen := nd.gen
	there, back := s.redisLegs(s.cfg.Jitter.Node)
	s.q.push(s.now+there, func() {
		if s.down(nd.reg) {
			s.q.push(s.now+back, func() {
				if !nd.alive || nd.gen != gen {
					s.met.decided(nd.reg.idx, k, s.now, refused)
					return
				}
				nd.storeFailed(k)
			})
			return
		}
		ok := nd.reg.store.check(s.now/1000, keyFn(string(s.subjects[k])), s.nodeSpec)
		s.q.push(s.now+back, func() {
			if !nd.alive || nd.gen != gen {
				s.met.decided(nd.reg.idx, k, s.now, refused)
				return
			}
			d := nd.exactDemand[k]
			if ok {
				d[0]++
			} else {
				d[1]++
			}
			nd.exactDemand[k] = d
			s.met.decided(nd.reg.idx, k, s.now, verdictOf(ok))
		})
	})
}

// crash stops the node as a crash would: calls in flight fail (what they
// leased at Redis stays leased), its leases' tokens are stranded, waiting
// requests get no answer (denied).
func (nd *node) crash() (stranded int64) {
	nd.alive = false
	for len(nd.inflight) > 0 {
		c := nd.inflight[0]
		c.failed, c.err = true, errCrashed
		nd.s.resume(c)
	}
	for k, ws := range nd.waiters {
		for range ws {
			nd.s.met.decided(nd.reg.idx, k, nd.s.now, refused)
		}
	}
	nd.waiters = nil
	return nd.m.Abort()
}

// source is the node's lease.Source: the region's store, a round trip
// away.
type source struct{ nd *node }

func (src source) Lease(_ context.Context, groups []lease.Group) ([]lease.Reply, error) {
	nd := src.nd
	s := nd.s
	c := s.cur
	if c == nil || c.nd != nd {
		panic("sim: a lease call outside its node's refill coroutine")
	}
	for _, g := range groups {
		for _, it := range g {
			k := keyIndex(it.Key)
			c.keys = append(c.keys, k)
			if !s.met.leased[k] {
				s.met.leased[k] = true
				s.met.keysLeased++
			}
		}
	}
	nd.inflight = append(nd.inflight, c)
	s.met.leaseCalls++
	there, back := s.redisLegs(s.cfg.Jitter.Node)
	st := nd.reg.store
	exp := s.now + int64(s.cfg.TTL+boundDelta)
	s.q.push(s.now+there, func() {
		var replies []lease.Reply
		var err error
		if s.down(nd.reg) {
			err = errStoreDown
		} else {
			// The script runs even if the node died meanwhile: its grant
			// is stranded, as a crashed node's would be.
			replies = make([]lease.Reply, len(groups))
			for gi, g := range groups {
				replies[gi] = st.lease(s.now/1000, g)
			}
		}
		s.q.push(s.now+back, func() {
			if c.failed {
				return
			}
			c.replies, c.err = replies, err
			for gi, rep := range replies {
				for i, it := range rep.Items {
					if it.Granted > 0 {
						k := keyIndex(groups[gi][i].Key)
						nd.grants[k] = append(nd.grants[k], grant{exp: exp, n: it.Granted})
					}
				}
			}
			s.resume(c)
		})
	})
	if !c.w.yield(struct{}{}) {
		return nil, errCrashed // the run is over
	}
	if c.err != nil {
		return nil, c.err
	}
	return c.replies, nil
}

// Return is return.lua, answered at once (only Close calls it; a
// simulated node never closes, it runs or crashes).
func (src source) Return(_ context.Context, items []lease.ReturnItem) (int64, error) {
	var n int64
	for _, it := range items {
		n += src.nd.reg.store.giveBack(src.nd.s.now/1000, it)
	}
	return n, nil
}

// keyFn is the Redis key of a subject, as policy.CompiledLimit.Key
// builds it: the subject in the hash tag.
func keyFn(subject string) string { return "rl:{" + subject + "}:g:l" }

func subject(k int) string { return "k" + strconv.Itoa(k) }

// keyIndex inverts keyFn(subject(k)).
func keyIndex(key string) int {
	i := strings.IndexByte(key, '{')
	j := strings.IndexByte(key, '}')
	k, err := strconv.Atoi(key[i+2 : j])
	if err != nil {
		panic("sim: foreign key " + key)
	}
	return k
}
