// Package policystore keeps policy sets where operators can change them
// while nodes run: a file, a NATS JetStream key-value bucket or a
// PostgreSQL table (or memory, for tests), each a Source behind one small
// interface. Each source pushes changes to watchers, keeps a version per
// policy (incremented on every write, checked optimistically) and the
// history of each policy.
//
// The Reloader turns a source's changes into compiled policy sets: it
// compiles the whole set before applying it and keeps the last known good
// set when a change does not validate.
//
// policystore owns where policies are kept and how their changes reach
// watchers; it counts no request (counters are a Store's: region,
// memstore). It never validates a single write: that is the admin API's
// job (it validates the whole resulting set before writing). A source
// therefore may hold a bad set, written by hand or by another tool, and
// watchers must be ready for it.
package policystore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/allot-dev/allot/policy"
)

// Source holds one policy set: the file-level settings and the policies,
// each stored and versioned on its own so that admins edit one policy
// without rewriting the others.
//
// Every method is safe for concurrent use. Versions count from 1; a
// policy's version increments on every write, including a delete (whose
// tombstone takes the next version) and a re-creation after it.
type Source interface {
	// Load reads the whole set as it is now. Entries that cannot be
	// decoded are left out of the file and listed in a returned
	// *policy.ValidationError (the file is returned too).
	Load(ctx context.Context) (*policy.File, Rev, error)
	// Watch calls fn with the current set, then again after every change,
	// until ctx is done; it returns nil then. fn calls are serial and may
	// coalesce bursts of changes. Watch rides out connection failures
	// itself (logging them); an error return means it cannot go on.
	Watch(ctx context.Context, fn func(Snapshot)) error

	// List returns every stored policy, ordered by id.
	List(ctx context.Context) ([]policy.Policy, error)
	// Get returns one policy, or an error matching ErrNotFound.
	Get(ctx context.Context, id string) (policy.Policy, error)
	// Put writes p under p.ID if the stored version is expect (AnyVersion:
	// whatever it is; NotExist: only if p.ID is not stored) and returns p
	// as stored, with its new version. A mismatch is a *ConflictError.
	Put(ctx context.Context, p policy.Policy, expect int64) (policy.Policy, error)
	// Delete removes a policy if its version is expect (or AnyVersion).
	Delete(ctx context.Context, id string, expect int64) error
	// History returns the versions of a policy the source still keeps,
	// newest first, the current one included; deletions are tombstones.
	History(ctx context.Context, id string) ([]Version, error)

	// Settings returns the file-level settings (tenants, default tier,
	// costs, runtime knobs). A source never written has empty settings at version 0.
	Settings(ctx context.Context) (Settings, error)
	// PutSettings replaces the settings document if its version is expect
	// (or AnyVersion) and returns it as stored.
	PutSettings(ctx context.Context, s Settings, expect int64) (Settings, error)

	// String names the source for logs and error sources, without secrets.
	String() string
	// Close releases connections. Watchers must have returned first.
	Close() error
}

// Rev identifies a state of a whole source. It is opaque: two loads with the
// same Rev hold the same set, but Revs need not be ordered (the file source
// uses a content hash).
type Rev uint64

// Snapshot is one state of a source, as delivered to watchers.
type Snapshot struct {
	File *policy.File
	Rev  Rev
	// Problems lists entries the source could not decode (they are not in
	// File). A snapshot with problems must not be applied.
	Problems []policy.Problem
}

// Settings is the file-level settings document: everything in a policy
// file but the policies. It is stored as one JSON document, so fields
// added later (a coordinator's runtime settings, say) need no migration.
type Settings struct {
	Tenants     map[string]string `json:"tenants,omitempty"`
	DefaultTier string            `json:"default_tier,omitempty"`
	Costs       map[string]int64  `json:"costs,omitempty"`
	// Rebalance and Lease are the runtime knobs of the coordinators and
	// of the nodes' leases (policy.File has the same blocks).
	Rebalance *policy.RebalanceKnobs `json:"rebalance,omitempty"`
	Lease     *policy.LeaseKnobs     `json:"lease,omitempty"`
	// Version is set by the source; 0 until the first write.
	Version int64 `json:"version,omitempty"`
}

// Version is one entry in a policy's history.
type Version struct {
	Version int64          `json:"version"`
	Deleted bool           `json:"deleted,omitempty"`
	Policy  *policy.Policy `json:"policy,omitempty"` // nil for a deletion
	Time    time.Time      `json:"time"`
}

// Expectations for Put, Delete and PutSettings.
const (
	// AnyVersion skips the version check: last writer wins.
	AnyVersion int64 = -1
	// NotExist makes Put a create: it fails if the policy exists.
	NotExist int64 = 0
)

// ErrNotFound is returned (wrapped) for a policy that is not stored.
var ErrNotFound = errors.New("policy not found")

// ErrConflict is matched by every *ConflictError.
var ErrConflict = errors.New("version conflict")

// ConflictError says a write expected another version than the stored one.
type ConflictError struct {
	ID       string // policy id, or "" for the settings document
	Expected int64
	Actual   int64 // 0: not stored
}

func (e *ConflictError) Error() string {
	what := fmt.Sprintf("policy %q", e.ID)
	if e.ID == "" {
		what = "settings"
	}
	switch {
	case e.Expected == NotExist:
		return fmt.Sprintf("%s already exists at version %d", what, e.Actual)
	case e.Actual == 0:
		return fmt.Sprintf("%s: expected version %d, but it does not exist", what, e.Expected)
	}
	return fmt.Sprintf("%s: expected version %d, stored version is %d", what, e.Expected, e.Actual)
}

// Is makes errors.Is(err, ErrConflict) hold.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// checkVersion returns a *ConflictError unless actual satisfies expect.
func checkVersion(id string, expect, actual int64) error {
	if expect == AnyVersion || expect == actual {
		return nil
	}
	return &ConflictError{ID: id, Expected: expect, Actual: actual}
}

func notFound(id string) error { return fmt.Errorf("%w: %q", ErrNotFound, id) }

// Options tune the sources that Open builds.
type Options struct {
	// Logger receives reconnects and watch failures. Nil discards.
	Logger *slog.Logger
	// PollInterval is how often the file source looks for changes and how
	// often the PostgreSQL source checks its revision when no notification
	// arrives. Zero picks the source's default.
	PollInterval time.Duration
	// NATS are extra options of the NATS source's connection: credentials
	// (nats.UserCredentials, nats.UserInfo) and TLS (nats.Secure).
	NATS []nats.Option
}

// Open opens the source a URL names:
//
//	file:PATH                  a YAML or JSON policy file (file:///abs/path works too)
//	nats://HOST:PORT[,...]     the JetStream KV bucket "allot-policies"
//	postgres://... | postgresql://...   the allot_policies tables, created if missing
//	memory:                    in process, empty, lost on exit (tests, trying the admin API)
//
// A NATS URL may carry ?replicas=N (bucket replicas when it is created); a
// PostgreSQL URL may carry ?refresh=DURATION (the periodic check behind
// LISTEN/NOTIFY); both parameters are removed before connecting.
func Open(ctx context.Context, rawURL string, opts Options) (Source, error) {
	scheme, _, ok := strings.Cut(rawURL, ":")
	if !ok {
		return nil, fmt.Errorf("store %q: want file:PATH, nats://HOST:PORT or postgres://USER@HOST/DB", rawURL)
	}
	switch strings.ToLower(scheme) {
	case "file":
		return OpenFile(filePath(rawURL), opts)
	case "nats", "tls":
		return OpenNATS(ctx, rawURL, opts)
	case "postgres", "postgresql":
		return OpenPostgres(ctx, rawURL, opts)
	case "memory":
		return NewMemory(), nil
	}
	return nil, fmt.Errorf("store %q: unknown scheme %q (want file, nats or postgres)", redact(rawURL), scheme)
}

// filePath takes the path out of file:PATH, file://PATH or file:///PATH.
func filePath(raw string) string {
	p := raw[len("file:"):]
	if strings.HasPrefix(p, "//") {
		if u, err := url.Parse(raw); err == nil && u.Path != "" {
			return u.Host + u.Path
		}
	}
	return p
}

// redact hides a URL's password for logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// takeParam removes name from u's query and returns its value.
func takeParam(u *url.URL, name string) string {
	q := u.Query()
	v := q.Get(name)
	q.Del(name)
	u.RawQuery = q.Encode()
	return v
}

// fileOf assembles a policy file from settings and policies (ordered by id).
func fileOf(s Settings, ps map[string]policy.Policy) *policy.File {
	f := &policy.File{}
	s.ApplyTo(f)
	for _, id := range slices.Sorted(maps.Keys(ps)) {
		f.Policies = append(f.Policies, ps[id])
	}
	return f
}

// SettingsOf returns the settings part of a policy file.
func SettingsOf(f *policy.File) Settings {
	return Settings{Tenants: f.Tenants, DefaultTier: f.DefaultTier, Costs: f.Costs, Rebalance: f.Rebalance, Lease: f.Lease}
}

// ApplyTo replaces f's settings with s, leaving its policies alone. It is
// SettingsOf's inverse, kept here so that a field added to the document
// is carried by every source and by the admin API alike.
func (s Settings) ApplyTo(f *policy.File) {
	f.Tenants, f.DefaultTier, f.Costs = s.Tenants, s.DefaultTier, s.Costs
	f.Rebalance, f.Lease = s.Rebalance, s.Lease
}

// problemsErr returns a *policy.ValidationError for problems, or nil.
func problemsErr(source string, problems []policy.Problem) error {
	if len(problems) == 0 {
		return nil
	}
	return &policy.ValidationError{Source: source, Problems: problems}
}

func (o *Options) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.Logger
}
