package policystore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/pgtest"
	"github.com/allot-dev/allot/policy"
)

func pol(id string, limit int64) policy.Policy {
	return policy.Policy{
		ID:     id,
		Per:    []policy.Field{policy.FieldTenant},
		Limits: []policy.Limit{{Name: "per_second", Algorithm: "token_bucket", Limit: limit, Period: policy.Duration(time.Second)}},
	}
}

func emptyFile(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	return path
}

func openURL(t *testing.T, url string) policystore.Source {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := policystore.Open(ctx, url, policystore.Options{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// sources opens each kind of source, fresh, for the same tests.
var sources = map[string]func(t *testing.T) policystore.Source{
	"memory":    func(t *testing.T) policystore.Source { return policystore.NewMemory() },
	"file-yaml": func(t *testing.T) policystore.Source { return openURL(t, "file:"+emptyFile(t, "p.yaml")) },
	"file-json": func(t *testing.T) policystore.Source { return openURL(t, "file:"+emptyFile(t, "p.json")) },
	"nats":      func(t *testing.T) policystore.Source { return openURL(t, natstest.Server(t)) },
	"postgres":  func(t *testing.T) policystore.Source { return openURL(t, pgtest.Database(t)) },
}

func forEachSource(t *testing.T, test func(t *testing.T, s policystore.Source)) {
	for name, open := range sources {
		t.Run(name, func(t *testing.T) { test(t, open(t)) })
	}
}

func TestVersionsConflictsAndHistory(t *testing.T) {
	forEachSource(t, func(t *testing.T, s policystore.Source) {
		ctx := context.Background()
		p, err := s.Put(ctx, pol("b.x", 5), policystore.NotExist)
		require.NoError(t, err)
		assert.Equal(t, int64(1), p.Version)

		_, err = s.Put(ctx, pol("b.x", 6), policystore.NotExist)
		var ce *policystore.ConflictError
		require.ErrorAs(t, err, &ce)
		assert.Equal(t, int64(1), ce.Actual)

		p, err = s.Put(ctx, pol("b.x", 6), 1)
		require.NoError(t, err)
		assert.Equal(t, int64(2), p.Version)
		_, err = s.Put(ctx, pol("b.x", 7), 1) // stale
		require.ErrorIs(t, err, policystore.ErrConflict)
		p, err = s.Put(ctx, pol("b.x", 7), policystore.AnyVersion)
		require.NoError(t, err)
		assert.Equal(t, int64(3), p.Version)
		_, err = s.Put(ctx, pol("a", 1), policystore.AnyVersion)
		require.NoError(t, err)

		got, err := s.Get(ctx, "b.x")
		require.NoError(t, err)
		assert.Equal(t, int64(7), got.Limits[0].Limit)
		assert.Equal(t, int64(3), got.Version)
		list, err := s.List(ctx)
		require.NoError(t, err)
		require.Len(t, list, 2)
		assert.Equal(t, []string{"a", "b.x"}, []string{list[0].ID, list[1].ID})

		require.ErrorIs(t, s.Delete(ctx, "b.x", 2), policystore.ErrConflict)
		require.NoError(t, s.Delete(ctx, "b.x", 3))
		_, err = s.Get(ctx, "b.x")
		require.ErrorIs(t, err, policystore.ErrNotFound)
		require.ErrorIs(t, s.Delete(ctx, "b.x", policystore.AnyVersion), policystore.ErrNotFound)

		hist, err := s.History(ctx, "b.x")
		require.NoError(t, err)
		require.Len(t, hist, 4)
		assert.True(t, hist[0].Deleted)
		assert.Equal(t, []int64{4, 3, 2, 1}, []int64{hist[0].Version, hist[1].Version, hist[2].Version, hist[3].Version})
		assert.Equal(t, int64(6), hist[2].Policy.Limits[0].Limit)

		// A re-created policy continues the versions.
		p, err = s.Put(ctx, pol("b.x", 8), policystore.NotExist)
		require.NoError(t, err)
		assert.Equal(t, int64(5), p.Version)

		_, err = s.History(ctx, "never")
		require.ErrorIs(t, err, policystore.ErrNotFound)
	})
}

func TestSettingsAndLoad(t *testing.T) {
	forEachSource(t, func(t *testing.T, s policystore.Source) {
		ctx := context.Background()
		st, err := s.Settings(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(0), st.Version)
		st, err = s.PutSettings(ctx, policystore.Settings{Tenants: map[string]string{"acme": "pro"}, DefaultTier: "free", Costs: map[string]int64{"POST /x": 3}}, policystore.NotExist)
		require.NoError(t, err)
		assert.Equal(t, int64(1), st.Version)
		_, err = s.PutSettings(ctx, policystore.Settings{DefaultTier: "pro"}, policystore.NotExist)
		require.ErrorIs(t, err, policystore.ErrConflict)
		_, err = s.Put(ctx, pol("z", 2), policystore.NotExist)
		require.NoError(t, err)

		f, rev1, err := s.Load(ctx)
		require.NoError(t, err)
		assert.Equal(t, "free", f.DefaultTier)
		assert.Equal(t, "pro", f.Tenants["acme"])
		assert.Equal(t, int64(3), f.Costs["POST /x"])
		require.Len(t, f.Policies, 1)
		set, err := policy.Compile(s.String(), f)
		require.NoError(t, err)
		assert.Equal(t, 1, set.Len())

		_, rev2, err := s.Load(ctx)
		require.NoError(t, err)
		assert.Equal(t, rev1, rev2, "an unchanged store keeps its revision")
		_, err = s.Put(ctx, pol("y", 2), policystore.NotExist)
		require.NoError(t, err)
		_, rev3, err := s.Load(ctx)
		require.NoError(t, err)
		assert.NotEqual(t, rev1, rev3)
	})
}

// snapshots collects what Watch delivers.
type snapshots struct {
	mu  sync.Mutex
	all []policystore.Snapshot
}

func (s *snapshots) add(snap policystore.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, snap)
}

func (s *snapshots) last() (policystore.Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.all) == 0 {
		return policystore.Snapshot{}, false
	}
	return s.all[len(s.all)-1], true
}

// watch runs s.Watch until the test ends.
func watch(t *testing.T, s policystore.Source) *snapshots {
	t.Helper()
	got := &snapshots{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Watch(ctx, got.add) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	return got
}

// deliveryBound is how long a test waits for a change to reach a
// watcher: a bound for a loaded 2-core machine, where a poll or a push
// can wait its turn for a CPU for a while, not the latency promised
// (about one poll interval; the tests log what they saw).
const deliveryBound = 10 * time.Second

// eventually polls cond every 10 ms until it holds or within passes.
func eventually(t *testing.T, within time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatchPushesChanges(t *testing.T) {
	forEachSource(t, func(t *testing.T, s policystore.Source) {
		ctx := context.Background()
		_, err := s.Put(ctx, pol("first", 1), policystore.NotExist)
		require.NoError(t, err)
		got := watch(t, s)
		eventually(t, 5*time.Second, func() bool {
			snap, ok := got.last()
			return ok && len(snap.File.Policies) == 1
		}, "the initial set")

		start := time.Now()
		_, err = s.Put(ctx, pol("second", 2), policystore.NotExist)
		require.NoError(t, err)
		eventually(t, deliveryBound, func() bool {
			snap, _ := got.last()
			return len(snap.File.Policies) == 2
		}, "the change")
		t.Logf("change seen after %v", time.Since(start))

		require.NoError(t, s.Delete(ctx, "first", policystore.AnyVersion))
		eventually(t, deliveryBound, func() bool {
			snap, _ := got.last()
			return len(snap.File.Policies) == 1 && snap.File.Policies[0].ID == "second"
		}, "the deletion")
	})
}

func TestOpenRejectsUnknownSchemes(t *testing.T) {
	_, err := policystore.Open(context.Background(), "redis://x", policystore.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown scheme")
	_, err = policystore.Open(context.Background(), "nopath", policystore.Options{})
	require.Error(t, err)
	_, err = policystore.Open(context.Background(), "file:"+filepath.Join(t.TempDir(), "missing.yaml"), policystore.Options{})
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestConflictErrorIsErrConflict(t *testing.T) {
	var err error = &policystore.ConflictError{ID: "a", Expected: 2, Actual: 3}
	assert.True(t, errors.Is(err, policystore.ErrConflict))
	assert.Contains(t, err.Error(), "expected version 2, stored version is 3")
}
