// Package middleware rate-limits a net/http handler with an Allot node.
//
// For each request it builds a check from the request's identity (headers
// and client IP, see Identity), asks the node with a short timeout, and
// then does one of three things:
//
//   - On an answer, it answers 429 itself with problem details or calls
//     the next handler; either way the response carries the header fields
//     package ratelimitheaders writes for that answer.
//   - When the node refuses the check as INVALID_ARGUMENT (an identity
//     the caller sent, such as an oversized header), it answers 400 with
//     problem details and no rate-limit fields: passing the request would
//     let any caller bypass the limiter by sending a bad header.
//   - When the node fails otherwise or cannot answer in time, the request
//     passes with X-RateLimit-Status: Bypass as its only rate-limit field:
//     a rate limiter outage must not become an outage of the API it
//     protects.
//
// The node's reverse-proxy mode (--upstream) is this middleware in front
// of an httputil.ReverseProxy, deciding in process.
package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/client"
	"github.com/allot-dev/allot/problem"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
	"github.com/allot-dev/allot/ratelimitheaders"
)

// DefaultTimeout bounds one check. A node answers in well under a
// millisecond; past this the request fails open rather than wait.
const DefaultTimeout = 20 * time.Millisecond

// CheckFunc asks for one decision. Errors carry gRPC status codes.
type CheckFunc func(ctx context.Context, in *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error)

// FromClient checks with a node over gRPC.
func FromClient(c ratelimitv1.RateLimiterServiceClient, opts ...grpc.CallOption) CheckFunc {
	return func(ctx context.Context, in *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
		return c.CheckRateLimit(ctx, in, opts...)
	}
}

// FromAllot checks with Allot nodes through package client: concurrent
// requests share batch calls, a throttled caller is answered from the
// client's deny cache until its retry time (header fields then carry the
// node's last answer with the retry counted down), and calls spread over
// the client's nodes. Leave the client's FailureMode at FailError (the
// default) so that the Limiter's own fail-open path (X-RateLimit-Status:
// Bypass) still applies; opts are passed to every Check.
func FromAllot(c *client.Client, opts ...client.CallOption) CheckFunc {
	return func(ctx context.Context, in *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
		return c.Check(ctx, in, opts...)
	}
}

// Options configure a Limiter.
type Options struct {
	Check    CheckFunc // required
	Identity Identity
	// Timeout bounds each check; 0 means DefaultTimeout.
	Timeout time.Duration
	// Logger gets a warning for every request that fails open (during an
	// outage, one per request: give it a handler that rate-limits);
	// nil discards them.
	Logger *slog.Logger
	// Observe, when set, is called once per request after the check, with
	// the answer or the error that made the request fail open. It runs on
	// the request path and must not block.
	Observe func(ctx context.Context, resp *ratelimitv1.RateLimitResponse, err error, elapsed time.Duration)
}

// Limiter is the middleware. It is safe for concurrent use.
type Limiter struct {
	check    CheckFunc
	identity Identity
	timeout  time.Duration
	log      *slog.Logger
	observe  func(ctx context.Context, resp *ratelimitv1.RateLimitResponse, err error, elapsed time.Duration)
}

// New returns a Limiter for opts.
func New(opts Options) (*Limiter, error) {
	if opts.Check == nil {
		return nil, errors.New("middleware: Options.Check is required")
	}
	if opts.Timeout < 0 {
		return nil, errors.New("middleware: Options.Timeout is negative")
	}
	l := &Limiter{check: opts.Check, identity: opts.Identity, timeout: opts.Timeout, log: opts.Logger, observe: opts.Observe}
	if l.timeout == 0 {
		l.timeout = DefaultTimeout
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return l, nil
}

// Wrap returns next behind the limiter.
func (l *Limiter) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.admit(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// admit checks r, sets the header fields on w, and reports whether r may
// go on; when it may not, admit has answered it.
func (l *Limiter) admit(w http.ResponseWriter, r *http.Request) bool {
	in := l.identity.Request(r)
	start := time.Now()
	ctx, cancel := context.WithTimeout(r.Context(), l.timeout)
	resp, err := l.check(ctx, in)
	cancel()
	if l.observe != nil {
		l.observe(r.Context(), resp, err, time.Since(start))
	}
	if err != nil {
		if status.Code(err) == codes.InvalidArgument {
			// The identity came from the caller (an oversized API key
			// header, say). Passing it would let any caller bypass the
			// limiter by sending a bad header.
			problem.Write(w, problem.BadRequest(status.Convert(err).Message(), "", r.URL.Path))
			return false
		}
		l.log.WarnContext(r.Context(), "rate limit check failed; failing open", "err", err)
		ratelimitheaders.SetBypass(w.Header())
		return true
	}
	ratelimitheaders.Set(w.Header(), resp)
	if resp.GetDecision() == ratelimitv1.RateLimitResponse_THROTTLED {
		problem.Write(w, problem.Throttled(resp, r.URL.Path))
		return false
	}
	return true
}
