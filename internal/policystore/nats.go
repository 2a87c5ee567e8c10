package policystore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/allot-dev/allot/policy"
)

// Bucket is the JetStream key-value bucket that holds the policies.
const Bucket = "allot-policies"

// Keys in the bucket: "settings" and "policy.<id>", where the dots of an
// id become "=" (a character ids cannot contain), because a dot separates
// subject tokens and "a..b" would not be a valid key.
const (
	settingsKey  = "settings"
	policyPrefix = "policy."
)

// natsReadyTimeout bounds how long Open waits for JetStream to answer (a
// server that has just started may not have JetStream ready yet).
const natsReadyTimeout = 15 * time.Second

// NATSSource keeps each policy under its own key of the JetStream KV bucket
// "allot-policies", as JSON, with the bucket's per-key history (64
// revisions) as the policy's history. Writes use the key's revision for
// compare-and-set, so concurrent admins cannot lose each other's updates.
type NATSSource struct {
	nc   *nats.Conn
	kv   jetstream.KeyValue
	name string
	log  *slog.Logger
}

// OpenNATS connects to the NATS servers of rawURL (comma-separated for a
// cluster) and binds the bucket, creating it if missing.
func OpenNATS(ctx context.Context, rawURL string, opts Options) (*NATSSource, error) {
	log := opts.logger()
	servers, replicas, err := natsURL(rawURL)
	if err != nil {
		return nil, err
	}
	name := redact(servers)
	nc, err := nats.Connect(servers, append([]nats.Option{
		nats.Name("allot policy store"),
		nats.MaxReconnects(-1), // a node outlives NATS restarts
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("nats disconnected", "store", name, "err", err)
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("nats reconnected", "store", name) }),
	}, opts.NATS...)...)
	if err != nil {
		return nil, fmt.Errorf("nats store %s: %w", name, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats store %s: %w", name, err)
	}
	kv, err := bindBucket(ctx, js, replicas)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("nats store %s: bucket %s: %w", name, Bucket, err)
	}
	return &NATSSource{nc: nc, kv: kv, name: name, log: log}, nil
}

// natsURL splits off our ?replicas= parameter.
func natsURL(raw string) (servers string, replicas int, err error) {
	replicas = 1
	base, query, _ := strings.Cut(raw, "?")
	if query == "" {
		return base, replicas, nil
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return "", 0, fmt.Errorf("nats store %q: %w", redact(raw), err)
	}
	if v := q.Get("replicas"); v != "" {
		if replicas, err = strconv.Atoi(v); err != nil || replicas < 1 || replicas > 5 {
			return "", 0, fmt.Errorf("nats store: replicas=%q: want 1 to 5", v)
		}
	}
	return base, replicas, nil
}

// bindBucket binds or creates the bucket, polling until JetStream answers.
func bindBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, natsReadyTimeout)
	defer cancel()
	for {
		kv, err := js.KeyValue(ctx, Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:      Bucket,
				Description: "Allot rate-limit policies",
				History:     jetstream.KeyValueMaxHistory,
				Storage:     jetstream.FileStorage,
				Replicas:    replicas,
			})
		}
		if err == nil {
			return kv, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// String names the servers, without credentials.
func (s *NATSSource) String() string { return s.name }

// Close closes the connection.
func (s *NATSSource) Close() error {
	s.nc.Close()
	return nil
}

// policyKey is the one escaping of a policy id into a key: "." becomes
// "=". Ids are [A-Za-z0-9_.-] (no "="), so the escaping is injective.
func policyKey(id string) string { return policyPrefix + strings.ReplaceAll(id, ".", "=") }

// idOfKey is policyKey's inverse, and nothing more: it accepts only a key
// policyKey could have written (after the prefix, [A-Za-z0-9_=-] and no
// "."). Mapping "policy.team.a" to "team.a" too made it an alias of
// "policy.team=a": one silently overrode the other, and deleting the alias
// dropped a policy whose document was still stored.
func idOfKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, policyPrefix)
	if !ok || rest == "" {
		return "", false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c == '_' || c == '-' || c == '=' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
			return "", false
		}
	}
	return strings.ReplaceAll(rest, "=", "."), true
}

// decodeStrict decodes JSON, rejecting unknown fields: a field another
// tool misspelt is a limit silently not enforced.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// natsState is the bucket's content as watchers rebuild it.
type natsState struct {
	settings Settings
	policies map[string]policy.Policy
	bad      map[string]policy.Problem // key -> why it did not decode
	rev      uint64
}

func newNATSState() *natsState {
	return &natsState{policies: map[string]policy.Policy{}, bad: map[string]policy.Problem{}}
}

func (st *natsState) apply(e jetstream.KeyValueEntry) {
	st.rev = max(st.rev, e.Revision())
	key := e.Key()
	deleted := e.Operation() != jetstream.KeyValuePut
	delete(st.bad, key)
	switch {
	case key == settingsKey:
		st.settings = Settings{}
		if !deleted {
			if err := decodeStrict(e.Value(), &st.settings); err != nil {
				st.bad[key] = policy.Problem{Field: "settings", Msg: "stored value does not decode: " + err.Error()}
			}
		}
	case strings.HasPrefix(key, policyPrefix):
		id, ok := idOfKey(key)
		if !ok {
			// Not a key any policy id maps to: loud, never an alias.
			if !deleted {
				st.bad[key] = policy.Problem{Field: "(key)", Msg: fmt.Sprintf("key %q is not the key of a policy id (an id's dots are stored as %q: %q)", key, "=", policyKey(strings.TrimPrefix(key, policyPrefix)))}
			}
			return
		}
		delete(st.policies, id)
		if deleted {
			return
		}
		var p policy.Policy
		switch err := decodeStrict(e.Value(), &p); {
		case err != nil:
			st.bad[key] = policy.Problem{Policy: id, Field: "(stored value)", Msg: "does not decode: " + err.Error()}
		case p.ID != id:
			st.bad[key] = policy.Problem{Policy: id, Field: "id", Msg: fmt.Sprintf("stored under key %q but says id %q", key, p.ID)}
		default:
			st.policies[id] = p
		}
	}
	// Other keys belong to someone else (a later coordinator, say).
}

func (st *natsState) snapshot() Snapshot {
	s := Snapshot{File: fileOf(st.settings, st.policies), Rev: Rev(st.rev)}
	for _, p := range st.bad {
		s.Problems = append(s.Problems, p)
	}
	return s
}

// Load reads the latest value of every key.
func (s *NATSSource) Load(ctx context.Context) (*policy.File, Rev, error) {
	w, err := s.kv.WatchAll(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: load: %w", s.name, err)
	}
	defer w.Stop()
	st := newNATSState()
	for {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, 0, fmt.Errorf("%s: load: watcher closed", s.name)
			}
			if e == nil { // every current value delivered
				snap := st.snapshot()
				return snap.File, snap.Rev, problemsErr(s.name, snap.Problems)
			}
			st.apply(e)
		}
	}
}

// Watch delivers the bucket after its initial values and then after every
// change. A burst of updates already queued is applied before delivering.
func (s *NATSSource) Watch(ctx context.Context, fn func(Snapshot)) error {
	for ctx.Err() == nil {
		err := s.watchOnce(ctx, fn)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("policy watch interrupted; restarting", "store", s.name, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

func (s *NATSSource) watchOnce(ctx context.Context, fn func(Snapshot)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer w.Stop()
	st := newNATSState()
	ready := false
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok = <-w.Updates():
		}
		if !ok {
			return errors.New("watcher closed")
		}
		if e == nil {
			ready = true
		} else {
			st.apply(e)
		}
		if ready && len(w.Updates()) == 0 {
			fn(st.snapshot())
		}
	}
}

func (s *NATSSource) get(ctx context.Context, id string) (policy.Policy, uint64, error) {
	e, err := s.kv.Get(ctx, policyKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return policy.Policy{}, 0, notFound(id)
	}
	if err != nil {
		return policy.Policy{}, 0, fmt.Errorf("%s: get %q: %w", s.name, id, err)
	}
	var p policy.Policy
	if err := decodeStrict(e.Value(), &p); err != nil {
		return policy.Policy{}, 0, fmt.Errorf("%s: policy %q: stored value does not decode: %w", s.name, id, err)
	}
	return p, e.Revision(), nil
}

// List returns every policy that decodes, ordered by id.
func (s *NATSSource) List(ctx context.Context) ([]policy.Policy, error) {
	f, _, err := s.Load(ctx)
	if f == nil {
		return nil, err
	}
	return f.Policies, nil
}

// Get returns one policy.
func (s *NATSSource) Get(ctx context.Context, id string) (policy.Policy, error) {
	p, _, err := s.get(ctx, id)
	return p, err
}

// Put writes p with compare-and-set on the key's revision.
func (s *NATSSource) Put(ctx context.Context, p policy.Policy, expect int64) (policy.Policy, error) {
	cur, rev, err := s.get(ctx, p.ID)
	exists := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return policy.Policy{}, err
	}
	if err := checkVersion(p.ID, expect, cur.Version); err != nil {
		return policy.Policy{}, err
	}
	if exists {
		p.Version = cur.Version + 1
	} else {
		// A re-created policy continues its deleted predecessor's versions.
		hist, err := s.History(ctx, p.ID)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return policy.Policy{}, err
		}
		p.Version = 1
		if len(hist) > 0 {
			p.Version = hist[0].Version + 1
		}
	}
	data, err := json.Marshal(p)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("encode policy %q: %w", p.ID, err)
	}
	if exists {
		_, err = s.kv.Update(ctx, policyKey(p.ID), data, rev)
	} else {
		_, err = s.kv.Create(ctx, policyKey(p.ID), data)
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return policy.Policy{}, s.raced(ctx, p.ID, expect)
	}
	if err != nil {
		return policy.Policy{}, fmt.Errorf("%s: put %q: %w", s.name, p.ID, err)
	}
	return p, nil
}

// raced reports a compare-and-set lost to a concurrent writer.
func (s *NATSSource) raced(ctx context.Context, id string, expect int64) error {
	cur, _, _ := s.get(ctx, id)
	return &ConflictError{ID: id, Expected: expect, Actual: cur.Version}
}

// Delete places a delete marker (the history stays).
func (s *NATSSource) Delete(ctx context.Context, id string, expect int64) error {
	cur, rev, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	if err := checkVersion(id, expect, cur.Version); err != nil {
		return err
	}
	err = s.kv.Delete(ctx, policyKey(id), jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return s.raced(ctx, id, expect)
	}
	if err != nil {
		return fmt.Errorf("%s: delete %q: %w", s.name, id, err)
	}
	return nil
}

// History returns the bucket's revisions of a policy, newest first. A
// delete marker carries no value; its version is the one before plus one.
func (s *NATSSource) History(ctx context.Context, id string) ([]Version, error) {
	entries, err := s.kv.History(ctx, policyKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, notFound(id)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: history %q: %w", s.name, id, err)
	}
	out := make([]Version, 0, len(entries))
	var last int64
	for _, e := range entries {
		v := Version{Time: e.Created().UTC()}
		if e.Operation() == jetstream.KeyValuePut {
			var p policy.Policy
			if err := decodeStrict(e.Value(), &p); err != nil {
				return nil, fmt.Errorf("%s: policy %q revision %d does not decode: %w", s.name, id, e.Revision(), err)
			}
			v.Version, v.Policy = p.Version, &p
		} else {
			v.Version, v.Deleted = last+1, true
		}
		last = v.Version
		out = append(out, v)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}

// Settings returns the settings document.
func (s *NATSSource) Settings(ctx context.Context) (Settings, error) {
	st, _, err := s.settings(ctx)
	return st, err
}

func (s *NATSSource) settings(ctx context.Context) (Settings, uint64, error) {
	e, err := s.kv.Get(ctx, settingsKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Settings{}, 0, nil
	}
	if err != nil {
		return Settings{}, 0, fmt.Errorf("%s: settings: %w", s.name, err)
	}
	var st Settings
	if err := decodeStrict(e.Value(), &st); err != nil {
		return Settings{}, 0, fmt.Errorf("%s: settings do not decode: %w", s.name, err)
	}
	return st, e.Revision(), nil
}

// PutSettings replaces the settings document with compare-and-set.
func (s *NATSSource) PutSettings(ctx context.Context, st Settings, expect int64) (Settings, error) {
	cur, rev, err := s.settings(ctx)
	if err != nil {
		return Settings{}, err
	}
	if err := checkVersion("", expect, cur.Version); err != nil {
		return Settings{}, err
	}
	st.Version = cur.Version + 1
	data, err := json.Marshal(st)
	if err != nil {
		return Settings{}, fmt.Errorf("encode settings: %w", err)
	}
	if rev == 0 {
		_, err = s.kv.Create(ctx, settingsKey, data)
	} else {
		_, err = s.kv.Update(ctx, settingsKey, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		now, _, _ := s.settings(ctx)
		return Settings{}, &ConflictError{Expected: expect, Actual: now.Version}
	}
	if err != nil {
		return Settings{}, fmt.Errorf("%s: put settings: %w", s.name, err)
	}
	return st, nil
}
