package policystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/allot-dev/allot/policy"
)

// DefaultPGRefresh is how often a PostgreSQL watcher checks the source's
// revision when no notification arrives: the safety net for a lost
// notification, not the way changes normally arrive (LISTEN/NOTIFY is).
const DefaultPGRefresh = 30 * time.Second

// pgChannel is the NOTIFY channel; the payload is the new revision.
const pgChannel = "allot_policies"

// pgSchema creates the tables (idempotently). The rules table is
// allot_policies, one row per policy, the body as JSON. Triggers, not Go
// code, keep versions, history, the source revision and the notification,
// so that a rule changed with plain SQL is versioned and pushed too.
// Needs PostgreSQL 14 or later (CREATE OR REPLACE TRIGGER).
const pgSchema = `
SELECT pg_advisory_xact_lock(7346029185);

CREATE TABLE IF NOT EXISTS allot_state (
	singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	rev bigint NOT NULL
);
INSERT INTO allot_state (singleton, rev) VALUES (true, 0) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS allot_policies (
	id text PRIMARY KEY,
	version bigint NOT NULL DEFAULT 0,
	body jsonb NOT NULL,
	updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS allot_policy_history (
	id text NOT NULL,
	version bigint NOT NULL,
	body jsonb, -- NULL: deleted
	written_at timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (id, version)
);

CREATE TABLE IF NOT EXISTS allot_settings (
	singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
	version bigint NOT NULL,
	body jsonb NOT NULL
);

CREATE OR REPLACE FUNCTION allot_policy_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		-- A re-created policy continues its deleted predecessor's versions.
		NEW.version := COALESCE((SELECT max(version) FROM allot_policy_history WHERE id = NEW.id), 0) + 1;
	ELSE
		NEW.version := OLD.version + 1;
	END IF;
	NEW.updated_at := now();
	RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION allot_policy_history_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'DELETE' THEN
		INSERT INTO allot_policy_history (id, version, body) VALUES (OLD.id, OLD.version + 1, NULL)
			ON CONFLICT (id, version) DO NOTHING;
		RETURN OLD;
	END IF;
	INSERT INTO allot_policy_history (id, version, body) VALUES (NEW.id, NEW.version, NEW.body)
		ON CONFLICT (id, version) DO UPDATE SET body = EXCLUDED.body, written_at = now();
	RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION allot_bump() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r bigint;
BEGIN
	UPDATE allot_state SET rev = rev + 1 RETURNING rev INTO r;
	PERFORM pg_notify('allot_policies', r::text);
	RETURN NULL;
END $$;

CREATE OR REPLACE TRIGGER allot_policies_version BEFORE INSERT OR UPDATE ON allot_policies
	FOR EACH ROW EXECUTE FUNCTION allot_policy_version();
CREATE OR REPLACE TRIGGER allot_policies_history AFTER INSERT OR UPDATE OR DELETE ON allot_policies
	FOR EACH ROW EXECUTE FUNCTION allot_policy_history_row();
CREATE OR REPLACE TRIGGER allot_policies_bump AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON allot_policies
	FOR EACH STATEMENT EXECUTE FUNCTION allot_bump();
CREATE OR REPLACE TRIGGER allot_settings_bump AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON allot_settings
	FOR EACH STATEMENT EXECUTE FUNCTION allot_bump();
`

// PostgresSource keeps policies in PostgreSQL (seed 003's rules database): nodes
// cache the whole set, hear changes at once through LISTEN/NOTIFY, and
// check the revision every refresh interval in case a notification was
// lost (notifications are not delivered to a disconnected listener).
type PostgresSource struct {
	pool    *pgxpool.Pool
	name    string
	refresh time.Duration
	log     *slog.Logger
}

// OpenPostgres connects and creates the schema if it is missing. rawURL
// is a libpq URL; ?refresh=DURATION sets the periodic check.
func OpenPostgres(ctx context.Context, rawURL string, opts Options) (*PostgresSource, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("postgres store: %w", err)
	}
	refresh := DefaultPGRefresh
	if opts.PollInterval > 0 {
		refresh = opts.PollInterval
	}
	if v := takeParam(u, "refresh"); v != "" {
		if refresh, err = time.ParseDuration(v); err != nil || refresh <= 0 {
			return nil, fmt.Errorf("postgres store: refresh=%q: want a positive duration", v)
		}
	}
	name := u.Redacted()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("postgres store %s: %w", name, err)
	}
	cfg.MaxConns = 4 // admin writes and reloads are rare; leave the server's slots to others
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres store %s: %w", name, err)
	}
	if _, err := pool.Exec(ctx, "BEGIN;"+pgSchema+"COMMIT;"); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres store %s: create schema: %w", name, err)
	}
	return &PostgresSource{pool: pool, name: name, refresh: refresh, log: opts.logger()}, nil
}

// String names the database, without the password.
func (s *PostgresSource) String() string { return s.name }

// Close closes the pool.
func (s *PostgresSource) Close() error {
	s.pool.Close()
	return nil
}

// Load reads the whole set in one snapshot, so the revision matches rows.
func (s *PostgresSource) Load(ctx context.Context) (*policy.File, Rev, error) {
	var (
		f        *policy.File
		rev      int64
		problems []policy.Problem
	)
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT rev FROM allot_state`).Scan(&rev); err != nil {
			return err
		}
		st, err := s.settingsIn(ctx, tx)
		if err != nil {
			problems = append(problems, policy.Problem{Field: "settings", Msg: err.Error()})
		}
		ps := map[string]policy.Policy{}
		rows, _ := tx.Query(ctx, `SELECT id, version, body FROM allot_policies`)
		var (
			id      string
			version int64
			body    []byte
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &version, &body}, func() error {
			p, err := decodePolicy(id, version, body)
			if err != nil {
				problems = append(problems, policy.Problem{Policy: id, Field: "(stored value)", Msg: "does not decode: " + err.Error()})
				return nil
			}
			ps[id] = p
			return nil
		})
		f = fileOf(st, ps)
		return err
	})
	if err != nil {
		return nil, 0, fmt.Errorf("%s: load: %w", s.name, err)
	}
	return f, Rev(rev), problemsErr(s.name, problems)
}

// decodePolicy decodes a stored body; the id and version columns win.
func decodePolicy(id string, version int64, body []byte) (policy.Policy, error) {
	var p policy.Policy
	if err := decodeStrict(body, &p); err != nil {
		return policy.Policy{}, err
	}
	p.ID, p.Version = id, version
	return p, nil
}

// Watch listens for notifications on a dedicated connection, delivering
// the set first and then whenever the revision moves. It reconnects
// (delivering again if anything changed meanwhile) until ctx is done.
func (s *PostgresSource) Watch(ctx context.Context, fn func(Snapshot)) error {
	w := &pgWatch{s: s, fn: fn}
	for ctx.Err() == nil {
		err := w.run(ctx)
		if ctx.Err() != nil {
			break
		}
		s.log.Warn("policy watch interrupted; reconnecting", "store", s.name, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return nil
}

type pgWatch struct {
	s         *PostgresSource
	fn        func(Snapshot)
	delivered bool
	last      Rev
}

func (w *pgWatch) run(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, w.s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgChannel); err != nil {
		return err
	}
	// Listening before loading: a change committed in between is seen twice
	// rather than missed.
	if err := w.deliver(ctx, false); err != nil {
		return err
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, w.s.refresh)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !pgconn.Timeout(err):
			return err
		case n != nil && n.Payload == strconv.FormatUint(uint64(w.last), 10):
			continue // our own view already
		}
		if err := w.deliver(ctx, true); err != nil {
			return err
		}
	}
}

// deliver loads and calls fn if the revision moved (or nothing was
// delivered yet). With check, it asks for the revision alone first, so the
// periodic refresh costs one tiny query when nothing changed.
func (w *pgWatch) deliver(ctx context.Context, check bool) error {
	if check && w.delivered {
		var rev int64
		if err := w.s.pool.QueryRow(ctx, `SELECT rev FROM allot_state`).Scan(&rev); err != nil {
			return err
		}
		if Rev(rev) == w.last {
			return nil
		}
	}
	f, rev, err := w.s.Load(ctx)
	if f == nil {
		return err
	}
	if w.delivered && rev == w.last {
		return nil
	}
	w.delivered, w.last = true, rev
	w.fn(Snapshot{File: f, Rev: rev, Problems: problemsOf(err)})
	return nil
}

// List returns every policy that decodes, ordered by id.
func (s *PostgresSource) List(ctx context.Context) ([]policy.Policy, error) {
	f, _, err := s.Load(ctx)
	if f == nil {
		return nil, err
	}
	return f.Policies, nil
}

// Get returns one policy.
func (s *PostgresSource) Get(ctx context.Context, id string) (policy.Policy, error) {
	var (
		version int64
		body    []byte
	)
	err := s.pool.QueryRow(ctx, `SELECT version, body FROM allot_policies WHERE id = $1`, id).Scan(&version, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return policy.Policy{}, notFound(id)
	}
	if err != nil {
		return policy.Policy{}, fmt.Errorf("%s: get %q: %w", s.name, id, err)
	}
	p, err := decodePolicy(id, version, body)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("%s: policy %q: stored value does not decode: %w", s.name, id, err)
	}
	return p, nil
}

// lockedVersion returns a policy's version (0: absent), locking its row.
func lockedVersion(ctx context.Context, tx pgx.Tx, id string) (int64, error) {
	var v int64
	err := tx.QueryRow(ctx, `SELECT version FROM allot_policies WHERE id = $1 FOR UPDATE`, id).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	return v, err
}

// Put inserts or updates p; the row lock makes the version check atomic,
// and a concurrent insert of the same id fails on the primary key.
func (s *PostgresSource) Put(ctx context.Context, p policy.Policy, expect int64) (policy.Policy, error) {
	p.Version = 0 // the trigger sets it; keep it out of the body
	body, err := json.Marshal(p)
	if err != nil {
		return policy.Policy{}, fmt.Errorf("encode policy %q: %w", p.ID, err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := lockedVersion(ctx, tx, p.ID)
		if err != nil {
			return err
		}
		if err := checkVersion(p.ID, expect, cur); err != nil {
			return err
		}
		if cur > 0 {
			return tx.QueryRow(ctx, `UPDATE allot_policies SET body = $2 WHERE id = $1 RETURNING version`, p.ID, string(body)).Scan(&p.Version)
		}
		return tx.QueryRow(ctx, `INSERT INTO allot_policies (id, body) VALUES ($1, $2) RETURNING version`, p.ID, string(body)).Scan(&p.Version)
	})
	if isUniqueViolation(err) {
		cur, _ := s.Get(ctx, p.ID)
		return policy.Policy{}, &ConflictError{ID: p.ID, Expected: expect, Actual: cur.Version}
	}
	if err != nil {
		return policy.Policy{}, s.wrap("put", p.ID, err)
	}
	return p, nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// wrap leaves the source's own errors (conflict, not found) as they are.
func (s *PostgresSource) wrap(op, id string, err error) error {
	if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
		return err
	}
	return fmt.Errorf("%s: %s %q: %w", s.name, op, id, err)
}

// Delete removes a policy; the trigger records the tombstone.
func (s *PostgresSource) Delete(ctx context.Context, id string, expect int64) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := lockedVersion(ctx, tx, id)
		if err != nil {
			return err
		}
		if cur == 0 {
			return notFound(id)
		}
		if err := checkVersion(id, expect, cur); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM allot_policies WHERE id = $1`, id)
		return err
	})
	if err != nil {
		return s.wrap("delete", id, err)
	}
	return nil
}

// History returns every recorded version of a policy, newest first.
func (s *PostgresSource) History(ctx context.Context, id string) ([]Version, error) {
	rows, _ := s.pool.Query(ctx, `SELECT version, body, written_at FROM allot_policy_history WHERE id = $1 ORDER BY version DESC`, id)
	var out []Version
	var (
		version int64
		body    []byte
		at      time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&version, &body, &at}, func() error {
		v := Version{Version: version, Time: at.UTC(), Deleted: body == nil}
		if body != nil {
			p, err := decodePolicy(id, version, body)
			if err != nil {
				return fmt.Errorf("version %d does not decode: %w", version, err)
			}
			v.Policy = &p
		}
		out = append(out, v)
		return nil
	})
	if err != nil {
		return nil, s.wrap("history", id, err)
	}
	if len(out) == 0 {
		return nil, notFound(id)
	}
	return out, nil
}

// Settings returns the settings document.
func (s *PostgresSource) Settings(ctx context.Context) (Settings, error) {
	st, err := s.settingsIn(ctx, s.pool)
	if err != nil {
		return Settings{}, fmt.Errorf("%s: settings: %w", s.name, err)
	}
	return st, nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *PostgresSource) settingsIn(ctx context.Context, q querier) (Settings, error) {
	var (
		version int64
		body    []byte
		st      Settings
	)
	err := q.QueryRow(ctx, `SELECT version, body FROM allot_settings`).Scan(&version, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return Settings{}, nil
	}
	if err != nil {
		return Settings{}, err
	}
	if err := decodeStrict(body, &st); err != nil {
		return Settings{}, fmt.Errorf("stored settings do not decode: %w", err)
	}
	st.Version = version
	return st, nil
}

// PutSettings replaces the settings document.
func (s *PostgresSource) PutSettings(ctx context.Context, st Settings, expect int64) (Settings, error) {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var cur int64
		err := tx.QueryRow(ctx, `SELECT version FROM allot_settings FOR UPDATE`).Scan(&cur)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if err := checkVersion("", expect, cur); err != nil {
			return err
		}
		st.Version = 0
		body, err := json.Marshal(st)
		if err != nil {
			return err
		}
		st.Version = cur + 1
		if cur == 0 {
			// A plain insert: two first writers race on the primary key.
			_, err = tx.Exec(ctx, `INSERT INTO allot_settings (singleton, version, body) VALUES (true, $1, $2)`, st.Version, string(body))
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE allot_settings SET version = $1, body = $2`, st.Version, string(body))
		return err
	})
	if isUniqueViolation(err) {
		return Settings{}, &ConflictError{Expected: expect}
	}
	if err != nil {
		return Settings{}, s.wrap("put settings", "", err)
	}
	return st, nil
}
