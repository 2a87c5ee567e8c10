package policystore

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/policy"
)

// Target receives compiled policy sets. *decide.Decider is one: its
// SetPolicies swaps the set atomically, checks in flight finish on the old
// set, and counters are untouched (they are keyed by policy and limit, not
// by set).
type Target interface {
	SetPolicies(*policy.Set)
}

// Reloader keeps a Target on the source's latest valid set. Every change is
// compiled as a whole before it is applied; a set that does not compile is
// rejected with each of its problems logged, and the target keeps the last
// known good set.
type Reloader struct {
	src Source
	log *slog.Logger

	mu     sync.Mutex
	status Status
}

// Status is what a Reloader last did.
type Status struct {
	Applied   Rev // revision of the set in force
	AppliedAt time.Time
	Policies  int // policies in the set in force
	// Rejected is the revision of the last rejected snapshot, and Err
	// its error (a *policy.ValidationError listing every problem); both are
	// cleared when a later snapshot is applied.
	Rejected   Rev
	RejectedAt time.Time
	// Rejections counts the snapshots rejected since the reloader
	// started (each revision once), for alerting on a bad push.
	Rejections uint64
	Err        error
}

// NewReloader returns a Reloader over src. Nil log discards.
func NewReloader(src Source, log *slog.Logger) *Reloader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reloader{src: src, log: log}
}

// Status returns what the reloader last did.
func (r *Reloader) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Load reads and compiles the source's set as it is now, for a node's first
// set. Unlike a reload there is no good set to keep, so a bad set is an
// error (a *policy.ValidationError listing every problem).
func (r *Reloader) Load(ctx context.Context) (*policy.Set, error) {
	f, rev, err := r.src.Load(ctx)
	if f == nil {
		return nil, err
	}
	set, err := compile(r.src.String(), Snapshot{File: f, Rev: rev, Problems: problemsOf(err)})
	if err != nil {
		return nil, err
	}
	r.applied(rev, set)
	return set, nil
}

// compile compiles a snapshot; the source's decoding problems and the
// validator's are reported together.
func compile(source string, s Snapshot) (*policy.Set, error) {
	set, err := policy.Compile(source, s.File)
	if len(s.Problems) == 0 {
		return set, err
	}
	var ve *policy.ValidationError
	if err != nil && !errors.As(err, &ve) {
		return nil, err
	}
	problems := slices.Concat(s.Problems, problemsOf(err))
	return nil, &policy.ValidationError{Source: source, Problems: problems}
}

func (r *Reloader) applied(rev Rev, set *policy.Set) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status.Applied, r.status.AppliedAt, r.status.Policies = rev, time.Now(), set.Len()
	r.status.Rejected, r.status.RejectedAt, r.status.Err = 0, time.Time{}, nil
}

// Run watches the source and applies each valid new set to target until
// ctx is done. Bursts of changes are coalesced: only the newest snapshot
// is compiled. If the source's watch fails, Run logs it and watches again.
func (r *Reloader) Run(ctx context.Context, target Target) error {
	var latest atomic.Pointer[Snapshot]
	wake := make(chan struct{}, 1)
	watchDone := make(chan struct{})
	go func() { // owned by Run, which waits for it
		defer close(watchDone)
		for ctx.Err() == nil {
			err := r.src.Watch(ctx, func(s Snapshot) {
				latest.Store(&s)
				select {
				case wake <- struct{}{}:
				default:
				}
			})
			if err == nil || ctx.Err() != nil {
				continue
			}
			r.log.Error("policy watch failed; retrying", "store", r.src.String(), "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			<-watchDone
			return nil
		case <-wake:
			if s := latest.Swap(nil); s != nil {
				r.apply(*s, target)
			}
		}
	}
}

func (r *Reloader) apply(s Snapshot, target Target) {
	st := r.Status()
	if s.Rev == st.Applied && st.AppliedAt != (time.Time{}) && len(s.Problems) == 0 {
		// The set in force (again, if a rejected change was undone).
		r.mu.Lock()
		r.status.Rejected, r.status.RejectedAt, r.status.Err = 0, time.Time{}, nil
		r.mu.Unlock()
		return
	}
	if s.Rev == st.Rejected && st.Err != nil {
		return // rejected already; said so
	}
	source := r.src.String()
	set, err := compile(source, s)
	if err != nil {
		r.reject(s.Rev, err)
		return
	}
	target.SetPolicies(set)
	r.applied(s.Rev, set)
	r.log.Info("policy set applied", "store", source, "rev", uint64(s.Rev), "policies", set.Len())
	if s.File != nil {
		for _, w := range policy.Warnings(s.File) {
			r.log.Warn("policy warning", "rev", uint64(s.Rev), "policy", w.Policy, "field", w.Field, "msg", w.Msg)
		}
	}
}

// reject logs the rejection before publishing it in Status, so whoever sees
// the rejected status also finds its problems in the log.
func (r *Reloader) reject(rev Rev, err error) {
	r.mu.Lock()
	applied := r.status.Applied
	r.mu.Unlock()
	problems := problemsOf(err)
	r.log.Error("policy set rejected; keeping the last known good set",
		"store", r.src.String(), "rev", uint64(rev), "in_force", uint64(applied), "problems", len(problems))
	for _, p := range problems {
		r.log.Error("policy problem", "rev", uint64(rev), "policy", p.Policy, "field", p.Field, "msg", p.Msg)
	}
	if len(problems) == 0 {
		r.log.Error("policy set rejected", "rev", uint64(rev), "err", err)
	}
	r.mu.Lock()
	r.status.Rejected, r.status.RejectedAt, r.status.Err = rev, time.Now(), err
	r.status.Rejections++
	r.mu.Unlock()
}
