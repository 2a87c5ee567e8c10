// Package ratelog rate-limits repeated log lines: an slog.Handler that
// lets through one record per message and level per interval and adds to
// the next one let through how many it suppressed. It is for lines that
// can fire per request or per refill: during an outage they would
// otherwise flood the log (954 "lease refill failed" lines in a 3 s Redis
// stall at 200 req/s).
//
// It only drops records: a record it lets through goes to the wrapped
// handler unchanged but for SuppressedKey, which levels are enabled is
// that handler's choice, and a suppressed count is reported only with
// the next record of its message and level that passes.
package ratelog

import (
	"context"
	stdlog "log"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// SuppressedKey is the attribute that carries how many records with the
// same message and level were dropped since the last one logged.
const SuppressedKey = "suppressed"

// DefaultEvery is the interval New uses for every <= 0.
const DefaultEvery = 10 * time.Second

// New returns a logger that passes to log's handler at most one record per
// (message, level) every interval, the first of each interval; a record
// after suppressed ones carries SuppressedKey=N. now is the clock (nil:
// time.Now). Loggers derived with With or WithGroup share the limits.
func New(log *slog.Logger, every time.Duration, now func() time.Time) *slog.Logger {
	if every <= 0 {
		every = DefaultEvery
	}
	if now == nil {
		now = time.Now
	}
	return slog.New(&handler{inner: log.Handler(), st: &state{every: every, now: now, seen: map[key]*entry{}}})
}

type key struct {
	msg   string
	level slog.Level
}

type entry struct {
	last       time.Time
	suppressed int64
}

// state is shared by a handler and every handler derived from it.
type state struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	seen  map[key]*entry
	swept time.Time // when a full seen was last cleared of idle entries
}

// maxKeys bounds seen. Messages are constants in code, so it is reached
// only if someone logs formatted messages: then entries idle for a whole
// interval are forgotten (at most once an interval, so a full map costs
// one scan per interval, not one per record), and a record that still
// finds no room passes unlimited rather than grow the map.
const maxKeys = 1024

// admit reports whether a record may pass and how many were suppressed
// before it.
func (s *state) admit(k key) (bool, int64) {
	t := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.seen[k]
	if e == nil {
		if len(s.seen) >= maxKeys && t.Sub(s.swept) >= s.every {
			s.swept = t
			for old, oe := range s.seen {
				if t.Sub(oe.last) >= s.every {
					delete(s.seen, old)
				}
			}
		}
		if len(s.seen) < maxKeys {
			s.seen[k] = &entry{last: t}
		}
		return true, 0
	}
	if t.Sub(e.last) < s.every {
		e.suppressed++
		return false, 0
	}
	n := e.suppressed
	e.last, e.suppressed = t, 0
	return true, n
}

type handler struct {
	inner slog.Handler
	st    *state
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	ok, n := h.st.admit(key{r.Message, r.Level})
	if !ok {
		return nil
	}
	if n > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int64(SuppressedKey, n))
	}
	return h.inner.Handle(ctx, r)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{inner: h.inner.WithAttrs(as), st: h.st}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), st: h.st}
}

// StdLogger returns a *log.Logger (net/http's ErrorLog) whose every line
// is a warning of log with the message msg and the line as "err". Such
// lines are formatted (a peer's address in each), so they are limited
// only as one message; pass a logger from New.
func StdLogger(log *slog.Logger, msg string) *stdlog.Logger {
	return stdlog.New(lineWriter{log: log, msg: msg}, "", 0)
}

type lineWriter struct {
	log *slog.Logger
	msg string
}

func (w lineWriter) Write(p []byte) (int, error) {
	w.log.Warn(w.msg, "err", strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
