package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/problem"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/ratelimitheaders"
)

// MaxBodyBytes bounds a POST /v1/check body. A check is a few hundred
// bytes; the bound keeps a hostile client from making the node buffer more.
const MaxBodyBytes = 64 << 10

// Event describes one check answered by a face, for metrics and traces.
type Event struct {
	Face     string           // "grpc", "http" or "envoy"
	Decision *decide.Decision // nil when Err is set
	Err      error
	Elapsed  time.Duration
}

// HTTPOptions configure the HTTP face. The zero value is usable.
type HTTPOptions struct {
	Logger *slog.Logger
	// Ready reports whether /readyz answers 200; nil means always.
	Ready func() bool
	// Status, when set, adds a line to the /healthz and /readyz bodies
	// (the node reports its store and breakers). It never changes the
	// status code: a node whose store is down still answers checks.
	Status func() string
	// Observe, when set, is called once per answered check, after the
	// answer is written. It must not block: it runs on the request path.
	Observe func(ctx context.Context, ev Event)
}

// HTTP serves POST /v1/check, GET /healthz and GET /readyz.
//
// A check's body is the JSON form of ratelimitv1.RateLimitRequest: proto
// field names (tenant_id) or their lowerCamelCase JSON names (tenantId),
// unknown fields rejected. The answer is 200 with the JSON of the
// decision when allowed or failed open, 429 with RFC 9457 problem details
// when throttled, 400 problem details for bad input; the RateLimit header
// fields (package ratelimitheaders) are on every decided answer.
type HTTP struct {
	checker Checker
	opts    HTTPOptions
	log     *slog.Logger
	mux     *http.ServeMux
}

// NewHTTP returns the HTTP face over c.
func NewHTTP(c Checker, opts HTTPOptions) *HTTP {
	s := &HTTP{checker: c, opts: opts, log: opts.Logger, mux: http.NewServeMux()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("POST /v1/check", s.check)
	s.mux.HandleFunc("/v1/check", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", http.MethodPost)
		d := problem.Status(http.StatusMethodNotAllowed, "use POST")
		d.Instance = r.URL.Path // like every other problem this face sends
		problem.Write(w, d)
	})
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { plain(w, http.StatusOK, s.withStatus("ok")) })
	s.mux.HandleFunc("GET /readyz", s.ready)
	return s
}

// ServeHTTP routes r.
func (s *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *HTTP) ready(w http.ResponseWriter, _ *http.Request) {
	if s.opts.Ready != nil && !s.opts.Ready() {
		plain(w, http.StatusServiceUnavailable, s.withStatus("not ready"))
		return
	}
	plain(w, http.StatusOK, s.withStatus("ready"))
}

func (s *HTTP) withStatus(msg string) string {
	if s.opts.Status == nil {
		return msg
	}
	return msg + "\n" + s.opts.Status()
}

func (s *HTTP) check(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	d, err := s.decide(w, r)
	if s.opts.Observe != nil {
		s.opts.Observe(r.Context(), Event{Face: "http", Decision: d, Err: err, Elapsed: time.Since(start)})
	}
}

// decide answers one check and returns what it decided, for Observe.
func (s *HTTP) decide(w http.ResponseWriter, r *http.Request) (*decide.Decision, error) {
	in, err := decodeCheck(w, r)
	if err != nil {
		s.httpError(w, r, err, r.URL.Path)
		return nil, err
	}
	req := request(in)
	if err := decide.Validate(&req); err != nil {
		s.httpError(w, r, err, r.URL.Path)
		return nil, err
	}
	d, err := s.checker.CheckAppend(r.Context(), &req, nil)
	if err != nil {
		s.httpError(w, r, err, r.URL.Path)
		return nil, err
	}
	resp := response(&d)
	ratelimitheaders.Set(w.Header(), resp)
	if d.Outcome == decide.Throttled {
		problem.Write(w, problem.Throttled(resp, instance(in.GetRoute(), r)))
		return &d, nil
	}
	writeJSON(w, http.StatusOK, answer(resp))
	return &d, nil
}

// bodyError is a body the handler cannot read as a check; status says how
// to answer it (400, or 413 for an oversized body).
type bodyError struct {
	status int
	err    error
}

func (e *bodyError) Error() string { return e.err.Error() }
func (e *bodyError) Unwrap() error { return e.err }

// decodeCheck reads the JSON form of a RateLimitRequest from r's body.
func decodeCheck(w http.ResponseWriter, r *http.Request) (*ratelimitv1.RateLimitRequest, error) {
	// Content-Type is not checked: the body must parse as JSON anyway, and
	// curl -d and many gateways label JSON as a form.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &bodyError{http.StatusRequestEntityTooLarge, err}
		}
		return nil, &bodyError{http.StatusBadRequest, err}
	}
	return parseCheck(body)
}

// parseCheck decodes a check body. protojson accepts both the proto and
// the lowerCamelCase names, enforces int32 range on token_cost, and rejects
// unknown fields, so a misspelt field is an error rather than a silently
// wider counter.
func parseCheck(body []byte) (*ratelimitv1.RateLimitRequest, error) {
	var in ratelimitv1.RateLimitRequest
	if err := protojson.Unmarshal(body, &in); err != nil {
		return nil, &bodyError{http.StatusBadRequest, err}
	}
	return &in, nil
}

// httpError maps the errors of a check (its body, decide.Validate, the
// Checker) to HTTP answers, as grpcError does for gRPC. The 405 of a
// wrong method is answered by its route.
func (s *HTTP) httpError(w http.ResponseWriter, r *http.Request, err error, inst string) {
	var bad *decide.InvalidError
	var body *bodyError
	switch {
	case errors.As(err, &bad):
		problem.Write(w, problem.BadRequest(bad.Error(), bad.Field, inst))
	case errors.As(err, &body):
		d := problem.BadRequest("body: "+body.Error(), "", inst)
		d.Status, d.Title = body.status, http.StatusText(body.status) // 413 says more than 400
		problem.Write(w, d)
	case errors.Is(err, context.Canceled):
		// The caller went away; nobody reads the answer.
	case errors.Is(err, context.DeadlineExceeded):
		problem.Write(w, problem.Status(http.StatusServiceUnavailable, err.Error()))
	case decide.IsOverloaded(err):
		problem.Write(w, problem.Status(http.StatusServiceUnavailable, "node overloaded, request shed: "+err.Error()))
	default:
		s.log.ErrorContext(r.Context(), "check failed", "err", err)
		problem.Write(w, problem.Status(http.StatusInternalServerError, "internal error"))
	}
}

func instance(route string, r *http.Request) string {
	if route != "" {
		return route
	}
	return r.URL.Path
}

// checkAnswer is the JSON of an allowed or failed-open check: the proto's
// field names, with 64-bit numbers as JSON numbers (protojson readers
// accept them) rather than the strings protojson writes.
type checkAnswer struct {
	Decision          string        `json:"decision"`
	Limit             int64         `json:"limit"`
	Remaining         int64         `json:"remaining"`
	ResetAfterSeconds int64         `json:"reset_after_seconds"`
	ViolationReason   string        `json:"violation_reason,omitempty"`
	RetryAfterMs      int64         `json:"retry_after_ms,omitempty"`
	PolicyID          string        `json:"policy_id,omitempty"`
	Statuses          []limitAnswer `json:"statuses,omitempty"`
	ShadowViolations  []limitAnswer `json:"shadow_violations,omitempty"`
	Degraded          bool          `json:"degraded,omitempty"`
}

type limitAnswer struct {
	PolicyID          string `json:"policy_id"`
	LimitName         string `json:"limit_name"`
	Limit             int64  `json:"limit"`
	Remaining         int64  `json:"remaining"`
	ResetAfterSeconds int64  `json:"reset_after_seconds"`
	WindowSeconds     int64  `json:"window_seconds"`
	Violated          bool   `json:"violated"`
	Exact             bool   `json:"exact"`
}

func answer(resp *ratelimitv1.RateLimitResponse) *checkAnswer {
	return &checkAnswer{
		Decision:          resp.GetDecision().String(),
		Limit:             resp.GetLimit(),
		Remaining:         resp.GetRemaining(),
		ResetAfterSeconds: resp.GetResetAfterSeconds(),
		ViolationReason:   resp.GetViolationReason(),
		RetryAfterMs:      resp.GetRetryAfterMs(),
		PolicyID:          resp.GetPolicyId(),
		Statuses:          limitAnswers(resp.GetStatuses()),
		ShadowViolations:  limitAnswers(resp.GetShadowViolations()),
		Degraded:          resp.GetDegraded(),
	}
}

func limitAnswers(in []*ratelimitv1.LimitStatus) []limitAnswer {
	if len(in) == 0 {
		return nil
	}
	out := make([]limitAnswer, len(in))
	for i, st := range in {
		out[i] = limitAnswer{
			PolicyID: st.GetPolicyId(), LimitName: st.GetLimitName(), Limit: st.GetLimit(),
			Remaining: st.GetRemaining(), ResetAfterSeconds: st.GetResetAfterSeconds(),
			WindowSeconds: st.GetWindowSeconds(), Violated: st.GetViolated(), Exact: st.GetExact(),
		}
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil { // unreachable: answers hold only strings, numbers, bools
		problem.Write(w, problem.Status(http.StatusInternalServerError, "encode answer"))
		return
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body) // the client went away; nothing to do
}

func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n")
}
