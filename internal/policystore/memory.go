package policystore

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/allot-dev/allot/policy"
)

// MemorySource keeps a set in process: for tests, and for an admin API
// tried out without a real source. It loses everything on exit.
type MemorySource struct {
	mu       sync.Mutex
	rev      Rev
	settings Settings
	policies map[string]policy.Policy
	history  map[string][]Version // oldest first
	changed  chan struct{}        // closed and replaced on every write
}

// NewMemory returns an empty in-process source.
func NewMemory() *MemorySource {
	return &MemorySource{policies: map[string]policy.Policy{}, history: map[string][]Version{}, changed: make(chan struct{})}
}

// String names the source.
func (m *MemorySource) String() string { return "memory" }

// Close does nothing.
func (m *MemorySource) Close() error { return nil }

// Load returns the set.
func (m *MemorySource) Load(context.Context) (*policy.File, Rev, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return fileOf(m.settings, m.policies), m.rev, nil
}

// Watch delivers the set now and after every write.
func (m *MemorySource) Watch(ctx context.Context, fn func(Snapshot)) error {
	for {
		m.mu.Lock()
		s := Snapshot{File: fileOf(m.settings, m.policies), Rev: m.rev}
		changed := m.changed
		m.mu.Unlock()
		fn(s)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// written records a write; call with mu held.
func (m *MemorySource) written() {
	m.rev++
	close(m.changed)
	m.changed = make(chan struct{})
}

// List returns the policies ordered by id.
func (m *MemorySource) List(context.Context) ([]policy.Policy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ps := slices.Collect(maps.Values(m.policies))
	slices.SortFunc(ps, func(a, b policy.Policy) int { return strings.Compare(a.ID, b.ID) })
	return ps, nil
}

// Get returns one policy.
func (m *MemorySource) Get(_ context.Context, id string) (policy.Policy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.policies[id]
	if !ok {
		return policy.Policy{}, notFound(id)
	}
	return p, nil
}

func (m *MemorySource) latest(id string) int64 {
	if vs := m.history[id]; len(vs) > 0 {
		return vs[len(vs)-1].Version
	}
	return 0
}

// Put writes p.
func (m *MemorySource) Put(_ context.Context, p policy.Policy, expect int64) (policy.Policy, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := checkVersion(p.ID, expect, m.policies[p.ID].Version); err != nil {
		return policy.Policy{}, err
	}
	p.Version = m.latest(p.ID) + 1
	m.policies[p.ID] = p
	m.history[p.ID] = append(m.history[p.ID], Version{Version: p.Version, Policy: &p, Time: time.Now().UTC()})
	m.written()
	return p, nil
}

// Delete removes a policy.
func (m *MemorySource) Delete(_ context.Context, id string, expect int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, ok := m.policies[id]
	if !ok {
		return notFound(id)
	}
	if err := checkVersion(id, expect, cur.Version); err != nil {
		return err
	}
	delete(m.policies, id)
	m.history[id] = append(m.history[id], Version{Version: cur.Version + 1, Deleted: true, Time: time.Now().UTC()})
	m.written()
	return nil
}

// History returns the versions of a policy, newest first.
func (m *MemorySource) History(_ context.Context, id string) ([]Version, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	vs := slices.Clone(m.history[id])
	if len(vs) == 0 {
		return nil, notFound(id)
	}
	slices.Reverse(vs)
	return vs, nil
}

// Settings returns the settings document.
func (m *MemorySource) Settings(context.Context) (Settings, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settings, nil
}

// PutSettings replaces the settings document.
func (m *MemorySource) PutSettings(_ context.Context, s Settings, expect int64) (Settings, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := checkVersion("", expect, m.settings.Version); err != nil {
		return Settings{}, err
	}
	s.Version = m.settings.Version + 1
	m.settings = s
	m.written()
	return s, nil
}
