// Package admin serves the policy admin API: HTTP/JSON over a
// policystore.Source, for allot-coordinator (and a node.Config.AdminAddr).
//
//	GET    /v1/policies                 list
//	POST   /v1/policies                 create (409 if the id exists)
//	GET    /v1/policies/{id}            one policy (ETag: "<version>")
//	PUT    /v1/policies/{id}            create or replace (If-Match or body version: checked)
//	DELETE /v1/policies/{id}            delete (If-Match: checked)
//	GET    /v1/policies/{id}/history    versions, newest first
//	POST   /v1/policies:validate        dry run of one policy or a whole file (also /v1/validate)
//	GET    /v1/settings, PUT /v1/settings   the file's settings, all but its policies (policystore.Settings)
//
// Every write is validated as the whole set it would produce (the store's
// current set with the change applied) before it is stored, so a write
// through this API can never leave a set that nodes would reject. Writes
// need "Authorization: Bearer TOKEN" when a token is configured. Every
// error is an RFC 9457 problem document; a validation failure lists every
// problem in "errors".
//
// admin owns no policy state: the store does. It must not serve writes
// without a token on a non-loopback address (see CheckAddr).
package admin

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/netutil"

	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
)

// Body size limits: one policy is small; a whole file for a dry run may
// hold many policies.
const (
	MaxPolicyBody = 1 << 20
	MaxFileBody   = 32 << 20
)

// Config is what a Server needs.
type Config struct {
	Store policystore.Source
	// Token is the bearer token writes must present. Empty: writes are
	// open, which CheckAddr allows on loopback addresses only.
	Token  string
	Logger *slog.Logger
	// MaxConcurrent bounds the requests that read a body and validate a
	// whole set (writes and dry runs) at once; 0 means DefaultMaxConcurrent.
	// One such request may decode a 32 MiB file, so an unbounded number of
	// them is a cheap way to take a node's CPU and memory.
	MaxConcurrent int
	// BusyWait is how long such a request waits for a slot before it is
	// answered 503 with Retry-After; 0 means DefaultBusyWait.
	BusyWait time.Duration
}

// Defaults of Config.MaxConcurrent and Config.BusyWait.
const (
	DefaultMaxConcurrent = 2
	DefaultBusyWait      = 5 * time.Second
)

// Server is the admin API's http.Handler.
type Server struct {
	store policystore.Source
	token []byte
	log   *slog.Logger
	mux   *http.ServeMux
	slots chan struct{} // one per write or dry run in progress
	wait  time.Duration
}

// New returns the admin API over cfg.Store.
func New(cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := cfg.MaxConcurrent
	if n <= 0 {
		n = DefaultMaxConcurrent
	}
	s := &Server{store: cfg.Store, token: []byte(cfg.Token), log: log, mux: http.NewServeMux(), slots: make(chan struct{}, n), wait: cfg.BusyWait}
	if s.wait <= 0 {
		s.wait = DefaultBusyWait
	}
	s.mux.HandleFunc("GET /v1/policies", s.list)
	s.mux.HandleFunc("POST /v1/policies", s.write(s.create))
	s.mux.HandleFunc("GET /v1/policies/{id}", s.get)
	s.mux.HandleFunc("PUT /v1/policies/{id}", s.write(s.put))
	s.mux.HandleFunc("DELETE /v1/policies/{id}", s.write(s.delete))
	s.mux.HandleFunc("GET /v1/policies/{id}/history", s.history)
	// A dry run costs what a write costs (decode and validate a whole
	// set), so it needs the token too.
	s.mux.HandleFunc("POST /v1/policies:validate", s.write(s.validate))
	s.mux.HandleFunc("POST /v1/validate", s.write(s.validate))
	s.mux.HandleFunc("GET /v1/settings", s.settings)
	s.mux.HandleFunc("PUT /v1/settings", s.write(s.putSettings))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, statusProblem(http.StatusNotFound, "no such endpoint"))
	})
	return s
}

// ServeHTTP serves the API. Answers are never cached: they describe
// configuration that changes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// CheckAddr refuses to serve writes without a token anywhere but on a
// loopback address: an open admin API on a network is anyone's limits.
//
// It also refuses a token no client can present: one that is blank or has
// leading or trailing white space (a presented token is trimmed, and a
// whitespace-only one passed the "needs a token" rule while locking every
// caller out).
func CheckAddr(addr, token string) error {
	if token != "" {
		if strings.TrimSpace(token) != token || strings.TrimSpace(token) == "" {
			return errors.New("admin token is blank or has leading or trailing white space: no client could present it (check --admin-token / ALLOT_ADMIN_TOKEN)")
		}
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("admin address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("admin API on non-loopback address %q needs a token (--admin-token or ALLOT_ADMIN_TOKEN)", addr)
}

// What a caller can hold of Serve before its token is looked at: a
// request's headers (net/http's default is 1 MiB) and connections.
// Operators and CI make a handful of calls at once; more connections wait
// in the kernel's accept queue.
const (
	maxHeaderBytes = 64 << 10
	maxConnections = 256
)

// Serve serves the API on lis until ctx is done, then shuts down,
// letting requests in flight finish for up to 5 seconds.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(netutil.LimitListener(lis, maxConnections)) }() // ends when Shutdown below runs
	select {
	case err := <-done:
		return fmt.Errorf("admin API: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// write wraps a write or dry-run handler with the bearer-token check and
// the concurrency bound (checked in that order, so an unauthorised caller
// never holds a slot).
func (s *Server) write(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="allot-admin"`)
			writeProblem(w, r, statusProblem(http.StatusUnauthorized, "writes need Authorization: Bearer <admin token>"))
			return
		}
		t := time.NewTimer(s.wait)
		defer t.Stop()
		select {
		case s.slots <- struct{}{}:
			defer func() { <-s.slots }()
		case <-t.C:
			w.Header().Set("Retry-After", "1")
			writeProblem(w, r, statusProblem(http.StatusServiceUnavailable, "admin API busy: too many writes and dry runs in progress"))
			return
		case <-r.Context().Done():
			return
		}
		h(w, r)
	}
}

func (s *Server) authorized(r *http.Request) bool {
	if len(s.token) == 0 {
		return true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	// Constant time, so response timing does not reveal a matching prefix.
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), s.token) == 1
}

// validID reports whether id can name a stored policy; anything else
// cannot exist, so reads answer 404 without asking the store.
func validID(id string) bool {
	if id == "" || len(id) > policy.MaxIDLen {
		return false
	}
	for _, r := range id {
		if !(r == '_' || r == '-' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')) {
			return false
		}
	}
	return true
}

// expectedVersion reads the version a write expects: If-Match ("3", W/
// ignored, * for any existing) or else the body's version, or AnyVersion.
func expectedVersion(r *http.Request, bodyVersion int64) (int64, *Problem) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" || h == "*" {
		if bodyVersion > 0 {
			return bodyVersion, nil
		}
		return policystore.AnyVersion, nil
	}
	v, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(h, "W/"), `"`), 10, 64)
	if err != nil || v < 1 {
		return 0, badRequest(fmt.Sprintf("If-Match %q: want a quoted version number such as \"3\"", h), FieldError{Field: "If-Match", Message: "not a version"})
	}
	if bodyVersion > 0 && bodyVersion != v {
		return 0, badRequest(fmt.Sprintf("If-Match says version %d, the body says %d", v, bodyVersion), FieldError{Field: "version", Message: "disagrees with If-Match"})
	}
	return v, nil
}

func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }
