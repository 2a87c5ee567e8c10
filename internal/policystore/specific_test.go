package policystore_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/internal/testenv/logbuf"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/pgtest"
	"github.com/allot-dev/allot/policy"
)

const handWritten = `# comment
default_tier: free
policies:
  - id: free
    match: {tier: free}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
`

func TestFileSourceSeesHandEditsAndRewritesReadably(t *testing.T) {
	path := emptyFile(t, "p.yaml")
	require.NoError(t, os.WriteFile(path, []byte(handWritten), 0o640))
	require.NoError(t, os.Chmod(path, 0o640))
	s := openURL(t, "file:"+path)
	got := watch(t, s)
	eventually(t, deliveryBound, func() bool { snap, ok := got.last(); return ok && len(snap.File.Policies) == 1 }, "initial file")

	// An edit by hand (not atomic, same inode) is seen.
	edited := strings.Replace(handWritten, "limit: 5", "limit: 6", 1)
	require.NoError(t, os.WriteFile(path, []byte(edited), 0o640))
	eventually(t, deliveryBound, func() bool {
		snap, _ := got.last()
		return snap.File.Policies[0].Limits[0].Limit == 6
	}, "hand edit")

	// A file that does not parse is delivered as a problem, and writes
	// through the store refuse to overwrite it.
	require.NoError(t, os.WriteFile(path, []byte("policies: [\n"), 0o640))
	eventually(t, deliveryBound, func() bool { snap, _ := got.last(); return len(snap.Problems) == 1 }, "parse problem")
	_, err := s.Put(context.Background(), pol("x", 1), policystore.AnyVersion)
	require.Error(t, err)

	// A write through the store keeps the file mode, reads back the same,
	// and is YAML a person can read.
	require.NoError(t, os.WriteFile(path, []byte(edited), 0o640))
	_, err = s.Put(context.Background(), pol("x", 1), policystore.NotExist)
	require.NoError(t, err)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), fi.Mode().Perm())
	text := string(data)
	assert.Contains(t, text, "- id: free\n")
	assert.Contains(t, text, "match: {tier: free}")
	assert.Contains(t, text, "per: [tenant]")
	assert.Contains(t, text, "period: 1s")
	assert.NotContains(t, text, "null")
	f, err := policy.Parse(path, data)
	require.NoError(t, err)
	require.Len(t, f.Policies, 2)
	assert.Equal(t, int64(6), f.Policies[0].Limits[0].Limit, "hand edit kept")
	assert.Equal(t, "x", f.Policies[1].ID, "file order kept, new policy appended")
	assert.Equal(t, "free", f.DefaultTier)
	eventually(t, deliveryBound, func() bool { snap, _ := got.last(); return len(snap.File.Policies) == 2 && snap.Problems == nil }, "own write")

	// History holds the hand-edited version too.
	hist, err := s.History(context.Background(), "free")
	require.NoError(t, err)
	require.Len(t, hist, 1)
}

func TestNATSSourceReportsUndecodableValues(t *testing.T) {
	url := natstest.Server(t)
	s := openURL(t, url)
	ctx := context.Background()
	_, err := s.Put(ctx, pol("good", 1), policystore.NotExist)
	require.NoError(t, err)

	// Another tool writes straight into the bucket.
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, policystore.Bucket)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "policy.bad", []byte(`{"id":"bad","limitz":[]}`))
	require.NoError(t, err)
	_, err = kv.Put(ctx, "policy.other", []byte(`{"id":"not-other","limits":[]}`))
	require.NoError(t, err)

	f, _, err := s.Load(ctx)
	var ve *policy.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 2)
	msg := err.Error()
	assert.Contains(t, msg, `policy "bad"`)
	assert.Contains(t, msg, "limitz")
	assert.Contains(t, msg, `"not-other"`)
	require.Len(t, f.Policies, 1, "the decodable policies are still returned")

	// Ids with dots are stored under keys NATS accepts.
	_, err = s.Put(ctx, pol("a..b.", 1), policystore.NotExist)
	require.NoError(t, err)
	p, err := s.Get(ctx, "a..b.")
	require.NoError(t, err)
	assert.Equal(t, "a..b.", p.ID)
}

func TestPostgresPushesPlainSQLChanges(t *testing.T) {
	url := pgtest.Database(t)
	s := openURL(t, url)
	ctx := context.Background()
	_, err := s.Put(ctx, pol("p1", 1), policystore.NotExist)
	require.NoError(t, err)
	got := watch(t, s)
	eventually(t, 5*time.Second, func() bool { snap, ok := got.last(); return ok && len(snap.File.Policies) == 1 }, "initial set")

	// A DBA edits the rules table by hand: versioned, historied and pushed
	// through NOTIFY (the refresh interval of the test store is 50 ms, so
	// use a long one to be sure the push is what delivered it).
	slow := openURL(t, url+"&refresh=1h")
	slowGot := watch(t, slow)
	eventually(t, 5*time.Second, func() bool { _, ok := slowGot.last(); return ok }, "initial set (slow refresh)")
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `UPDATE allot_policies SET body = jsonb_set(body, '{limits,0,limit}', '9') WHERE id = 'p1'`)
	require.NoError(t, err)
	eventually(t, deliveryBound, func() bool {
		snap, _ := slowGot.last()
		return len(snap.File.Policies) == 1 && snap.File.Policies[0].Limits[0].Limit == 9
	}, "the SQL change, pushed")
	p, err := s.Get(ctx, "p1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), p.Version)
	hist, err := s.History(ctx, "p1")
	require.NoError(t, err)
	assert.Len(t, hist, 2)

	// A body that does not decode is a problem, not a silent omission.
	_, err = conn.Exec(ctx, `INSERT INTO allot_policies (id, body) VALUES ('junk', '{"limitz": 1}')`)
	require.NoError(t, err)
	eventually(t, deliveryBound, func() bool { snap, _ := slowGot.last(); return len(snap.Problems) == 1 }, "problem pushed")
	snap, _ := slowGot.last()
	assert.Equal(t, "junk", snap.Problems[0].Policy)
}

// target records the sets a Reloader applies.
type target struct{ set atomic.Pointer[policy.Set] }

func (t *target) SetPolicies(s *policy.Set) { t.set.Store(s) }

func TestReloaderKeepsLastKnownGoodSet(t *testing.T) {
	path := emptyFile(t, "p.yaml")
	require.NoError(t, os.WriteFile(path, []byte(handWritten), 0o600))
	s := openURL(t, "file:"+path)
	logs := &logbuf.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	r := policystore.NewReloader(s, log)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	initial, err := r.Load(ctx)
	require.NoError(t, err)
	tg := &target{}
	tg.SetPolicies(initial)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx, tg) }()

	bad := strings.Replace(handWritten, "limit: 5", "limit: 0", 1)
	bad = strings.Replace(bad, "algorithm: token_bucket", "algorithm: leaky", 1)
	require.NoError(t, os.WriteFile(path, []byte(bad), 0o600))
	eventually(t, deliveryBound, func() bool { return r.Status().Err != nil }, "rejection")
	var ve *policy.ValidationError
	require.ErrorAs(t, r.Status().Err, &ve)
	assert.Len(t, ve.Problems, 2)
	assert.Same(t, initial, tg.set.Load(), "the last known good set stays")
	assert.Contains(t, logs.String(), "limits[0].algorithm")
	assert.Contains(t, logs.String(), "limits[0].limit")
	assert.Contains(t, logs.String(), "keeping the last known good set")

	good := strings.Replace(handWritten, "limit: 5", "limit: 7", 1)
	require.NoError(t, os.WriteFile(path, []byte(good), 0o600))
	eventually(t, deliveryBound, func() bool { return tg.set.Load() != initial }, "the good set")
	assert.NoError(t, r.Status().Err)
	req := policy.Request{Tenant: "t"}
	set := tg.set.Load()
	ps := set.Match(&req, set.Tier(&req), nil)
	require.Len(t, ps, 1)
	assert.Equal(t, int64(7), ps[0].Limits[0].Spec.Limit)

	cancel()
	require.NoError(t, <-done)
}

// A bad set at start has no good set to fall back on: Load fails, naming
// every problem.
func TestReloaderLoadFailsOnABadSet(t *testing.T) {
	path := emptyFile(t, "p.yaml")
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(handWritten, "period: 1s", "period: 0s", 1)), 0o600))
	_, err := policystore.NewReloader(openURL(t, "file:"+path), nil).Load(context.Background())
	require.Error(t, err)
	assert.Contains(t, err.Error(), path)
	assert.Contains(t, err.Error(), `policy "free": limits[0].period`)
}

// A key that is not the key of any id ("policy.team.a", where the store
// writes "policy.team=a") is a problem, never an alias: before, it
// silently overrode team.a, and deleting it dropped team.a from every node.
func TestNATSKeyAliasIsAProblemNotAnOverride(t *testing.T) {
	url := natstest.Server(t)
	s := openURL(t, url)
	ctx := context.Background()
	_, err := s.Put(ctx, pol("team.a", 1), policystore.NotExist)
	require.NoError(t, err)

	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, policystore.Bucket)
	require.NoError(t, err)
	_, err = kv.Put(ctx, "policy.team.a", []byte(`{"id":"team.a","per":["tenant"],"limits":[{"name":"per_second","algorithm":"token_bucket","limit":1000,"period":"1s"}]}`))
	require.NoError(t, err)

	f, _, err := s.Load(ctx)
	var ve *policy.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Contains(t, err.Error(), `"policy.team.a"`)
	require.Len(t, f.Policies, 1)
	assert.Equal(t, int64(1), f.Policies[0].Limits[0].Limit, "the alias did not override team.a")

	require.NoError(t, kv.Delete(ctx, "policy.team.a"))
	f, _, err = s.Load(ctx)
	require.NoError(t, err)
	require.Len(t, f.Policies, 1, "deleting the alias keeps team.a")
	assert.Equal(t, "team.a", f.Policies[0].ID)
}
