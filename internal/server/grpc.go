// Package server turns wire requests into checks and decisions into wire
// answers, on every face a node serves: the gRPC RateLimiterService of the
// seed's contract (grpc.go), its HTTP face with problem+json errors
// (http.go), Envoy's RLS (envoy.go), the one mapping of a decision to its
// answer, written straight into wire bytes (answer.go), and the gRPC
// codec of the node's messages, which decodes one made only of known,
// well-formed fields with vtprotobuf's generated code instead of
// reflection, hands any other (unknown fields, malformed) to
// proto.Unmarshal, and answers a message that is not protobuf, or one
// with more elements than its handler accepts, as INVALID_ARGUMENT before
// decoding it (wirecodec.go, codec.go, fanout.go).
//
// It owns the wire formats of those faces and the mapping of a check's
// errors to answers: grpcError for gRPC and httpError for HTTP map what
// decide.Validate or a Checker returns. A call's own bad arguments (a
// batch too large, an empty domain, a message that is not protobuf) and
// a batch's invalid check, named by its index, are answered
// INVALID_ARGUMENT where they are found. It must not validate or decide
// (decide.Validate and a Checker do), keep counters, or answer a check
// whose request failed validation with anything but INVALID_ARGUMENT
// (HTTP 400).
package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/decide"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// MaxBatch is the most checks one CheckRateLimitBatch call may carry.
const MaxBatch = 1000

// MaxMessageBytes is the gRPC receive limit a node sets: the largest legal
// call, a batch of MaxBatch checks (or an Envoy request of MaxBatch
// descriptors with the default keys) with every field at its length limit,
// plus room for the Envoy domain. A larger message cannot be valid, and
// grpc-go refuses it from its 5-byte length prefix (RESOURCE_EXHAUSTED)
// before allocating it; grpc-go's 4 MiB default let 200 concurrent ~4 MB
// messages, all invalid, take a node to 1.3 GB. The tests check a
// largest legal batch fits.
const MaxMessageBytes = MaxBatch*maxCheckBytes + 64<<10

// maxCheckBytes bounds one legal check on the wire: the field limits of
// decide.Validate (2,048 + 3 x 256 + 64 + 16 bytes) plus tags, lengths and,
// for Envoy, the entries' key names.
const maxCheckBytes = 3200

// Checker decides one validated request, building the decision's
// statuses in the storage of buf (Statuses is append(buf[:0], ...)): a
// single check gives room inside its answer's allocation and a batch
// one array for all its checks, so a check costs no allocation of its
// own for them; nil gives none. *decide.Decider is one (CheckAppend).
type Checker interface {
	CheckAppend(ctx context.Context, r *decide.Request, buf []decide.Status) (decide.Decision, error)
}

// GRPC implements ratelimitv1.RateLimiterServiceServer.
type GRPC struct {
	ratelimitv1.UnimplementedRateLimiterServiceServer
	checker Checker
	observe func(ctx context.Context, ev Event)
	// batches holds *batchScratch: a batch's working arrays, reused by
	// the next batch (BenchmarkGRPCBatch100: a fifth of its bytes).
	batches sync.Pool
	// check and batch serve the two methods (Register).
	check *hotMethod[ratelimitv1.RateLimitRequest, *ratelimitv1.RateLimitRequest]
	batch *hotMethod[ratelimitv1.BatchRateLimitRequest, *ratelimitv1.BatchRateLimitRequest]
}

// GRPCOptions configure the gRPC service. The zero value is usable.
type GRPCOptions struct {
	// Observe, when set, is called once per check (each check of a batch
	// too) with Face "grpc", before the answer is sent, so a metric read
	// after the answer arrived includes it. It must not block.
	Observe func(ctx context.Context, ev Event)
}

// NewGRPC returns the gRPC service over c. opts is optional (at most one
// is used), so existing callers need no change.
func NewGRPC(c Checker, opts ...GRPCOptions) *GRPC {
	s := &GRPC{checker: c}
	if len(opts) > 0 {
		s.observe = opts[0].Observe
	}
	s.check = newHotMethod(s, ratelimitv1.RateLimiterService_CheckRateLimit_FullMethodName, s.answerCheck,
		(*ratelimitv1.RateLimitRequest).Reset)
	s.batch = newHotMethod(s, ratelimitv1.RateLimiterService_CheckRateLimitBatch_FullMethodName, s.answerBatch,
		resetBatch)
	return s
}

// Register registers s on r as the RateLimiterService, as
// ratelimitv1.RegisterRateLimiterServiceServer does, but with the two hot
// methods served by hotMethod handlers, which answer in wire form: r must
// be a server built with MalformedIsInvalid's options, whose codec sends
// those bytes.
func (s *GRPC) Register(r grpc.ServiceRegistrar) {
	desc := ratelimitv1.RateLimiterService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i := range desc.Methods {
		switch desc.Methods[i].MethodName {
		case "CheckRateLimit":
			desc.Methods[i].Handler = s.check.handle
		case "CheckRateLimitBatch":
			desc.Methods[i].Handler = s.batch.handle
		}
	}
	r.RegisterService(&desc, s)
}

// hotMethod serves a unary method as its generated handler does, with two
// changes: the message a call decodes into comes from a pool and goes
// back (emptied by reset) once the interceptors and the method have
// returned, and the info and handler handed to the interceptors are made
// once, not per call (three allocations per call, of a single check's
// few dozen). Only this handler puts a message in its pool: it created
// it, and a handler's request is not used after it returns (its strings
// point into an array of their own, which the wire codec never reuses).
type hotMethod[M any, PM interface {
	*M
	proto.Message
}] struct {
	pool  sync.Pool
	reset func(PM)
	info  grpc.UnaryServerInfo
	call  grpc.UnaryHandler
}

func newHotMethod[M any, PM interface {
	*M
	proto.Message
}](s *GRPC, fullMethod string, call func(context.Context, PM) (any, error), reset func(PM)) *hotMethod[M, PM] {
	return &hotMethod[M, PM]{
		reset: reset,
		info:  grpc.UnaryServerInfo{Server: s, FullMethod: fullMethod},
		call:  func(ctx context.Context, req any) (any, error) { return call(ctx, req.(PM)) },
	}
}

func (h *hotMethod[M, PM]) handle(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in, _ := h.pool.Get().(PM)
	if in == nil {
		in = new(M)
	}
	defer h.put(in)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return h.call(ctx, in)
	}
	return interceptor(ctx, in, &h.info, h.call)
}

func (h *hotMethod[M, PM]) put(in PM) {
	h.reset(in)
	h.pool.Put(in)
}

// resetBatch empties in, keeping the room of its checks (the codec
// empties a check before decoding into it: the arrays of a 100-check
// call were 17 KB of its allocations).
func resetBatch(in *ratelimitv1.BatchRateLimitRequest) {
	room := in.Requests[:0]
	in.Reset()
	in.Requests = room
}

// CheckRateLimit decides one request. (A node's gRPC service answers in
// wire form, Register; this is the answer as a message, for a caller in
// process.)
func (s *GRPC) CheckRateLimit(ctx context.Context, in *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
	a, err := s.decideOne(ctx, in)
	if err != nil {
		return nil, err
	}
	return response(&a.d), nil
}

// answerCheck is a node's CheckRateLimit (Register): the answer's bytes
// written into the check's own allocation.
func (s *GRPC) answerCheck(ctx context.Context, in *ratelimitv1.RateLimitRequest) (any, error) {
	a, err := s.decideOne(ctx, in)
	if err != nil {
		return nil, err
	}
	a.sb = appendResponse(a.room[:0], &a.d)
	return &a.encoded, nil
}

// decideOne validates and decides one request, in one allocation that then
// holds its answer's bytes too.
func (s *GRPC) decideOne(ctx context.Context, in *ratelimitv1.RateLimitRequest) (*wireAnswer, error) {
	var start time.Time
	if s.observe != nil {
		start = time.Now()
	}
	a := new(wireAnswer)
	a.req = request(in)
	if err := decide.Validate(&a.req); err != nil {
		s.observeErr(ctx, err, start)
		return nil, grpcError(err)
	}
	d, err := s.checker.CheckAppend(ctx, &a.req, a.statuses[:0])
	if err != nil {
		s.observeErr(ctx, err, start)
		return nil, grpcError(err)
	}
	a.d = d
	if s.observe != nil {
		s.observeDecision(ctx, &a.d, start)
	}
	return a, nil
}

// wireAnswer is one gRPC check: its request (it escapes through the
// Checker interface), the decision's statuses, the decision, and its
// answer's bytes, which fit in room unless its strings are long.
type wireAnswer struct {
	encoded
	statuses [2]decide.Status
	req      decide.Request
	d        decide.Decision
	room     [wireRoom]byte
}

// observeDecision takes a decision that is already in the heap (the
// answer's, the batch's scratch): the hook's Event points to it, so a
// decision of the caller's stack would move to the heap on every check.
func (s *GRPC) observeDecision(ctx context.Context, d *decide.Decision, start time.Time) {
	s.observe(ctx, Event{Face: "grpc", Decision: d, Elapsed: time.Since(start)})
}

func (s *GRPC) observeErr(ctx context.Context, err error, start time.Time) {
	if s.observe != nil {
		s.observe(ctx, Event{Face: "grpc", Err: err, Elapsed: time.Since(start)})
	}
}

// Undoer is implemented by checkers that can give back what an allowed
// decision took (*decide.Decider does).
type Undoer interface {
	Undo(ctx context.Context, r *decide.Request, d decide.Decision)
}

// undoTimeout bounds the refunds of a batch that failed midway; they run
// after the caller's context ended, so they need their own deadline.
const undoTimeout = 250 * time.Millisecond

// CheckRateLimitBatch is appendBatch's answer as a message, for a caller
// in process (a node's gRPC service answers in wire form, Register).
func (s *GRPC) CheckRateLimitBatch(ctx context.Context, in *ratelimitv1.BatchRateLimitRequest) (*ratelimitv1.BatchRateLimitResponse, error) {
	b, err := s.appendBatch(ctx, nil, in)
	if err != nil {
		return nil, err
	}
	out := &ratelimitv1.BatchRateLimitResponse{}
	if err := out.UnmarshalVTUnsafe(b); err != nil {
		return nil, status.Errorf(codes.Internal, "decode the batch's own answer: %v", err)
	}
	return out, nil
}

// answerBatch is a node's CheckRateLimitBatch (Register): the answers'
// bytes written into a buffer of the transport's pool, which frees it
// once sent.
func (s *GRPC) answerBatch(ctx context.Context, in *ratelimitv1.BatchRateLimitRequest) (any, error) {
	pool := mem.DefaultBufferPool()
	buf := pool.Get(len(in.GetRequests()) * batchAnswerBytes)
	b, err := s.appendBatch(ctx, (*buf)[:0], in)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	return &encoded{slice: [1]mem.Buffer{mem.NewBuffer(buf, pool)}}, nil
}

// batchAnswerBytes is room for one answer of a batch with one status,
// to size the buffer a batch's answers are written into.
const batchAnswerBytes = 96

// appendBatch validates every check first, so a bad one fails the call
// before anything is counted, then decides each in order and appends its
// answer (a BatchRateLimitResponse's field 1) to b. If a check fails
// midway (the call's deadline passed, or it was cancelled), the call
// answers only the error, so the checks already decided are given back
// (Undoer): a failed batch counts nothing, as a bad one does.
func (s *GRPC) appendBatch(ctx context.Context, b []byte, in *ratelimitv1.BatchRateLimitRequest) ([]byte, error) {
	n := len(in.GetRequests())
	if n > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "requests: %d checks exceed the maximum of %d per call", n, MaxBatch)
	}
	sc := s.scratch(n)
	defer s.release(sc)
	reqs, decided := sc.reqs, sc.decided
	for i, rq := range in.GetRequests() {
		reqs[i] = request(rq)
		if err := decide.Validate(&reqs[i]); err != nil {
			s.observeErr(ctx, err, time.Now())
			return nil, status.Errorf(codes.InvalidArgument, "requests[%d].%v", i, err)
		}
	}
	for i := range reqs {
		var start time.Time
		if s.observe != nil {
			start = time.Now()
		}
		d, err := s.checker.CheckAppend(ctx, &reqs[i], sc.statuses)
		if err != nil {
			s.observeErr(ctx, err, start)
			s.undo(ctx, reqs[:i], decided[:i])
			return nil, grpcError(fmt.Errorf("requests[%d]: %w", i, err))
		}
		decided[i] = d
		if s.observe != nil {
			s.observeDecision(ctx, &decided[i], start)
		}
		var at int
		b, at = openMessage(b, 1)
		b = closeMessage(appendResponse(b, &d), at)
		decided[i].Statuses = nil // undo reads the rest; sc.statuses is reused
	}
	return b, nil
}

// batchScratch is what a batch works in and does not answer with: the
// validated requests, what undo needs of each decision (Statuses are not
// kept: their storage is reused by the next check) and the statuses'
// buffer. Nothing keeps it past the call: the decider does not keep a
// request, and the answer copies what it sends.
type batchScratch struct {
	reqs     []decide.Request
	decided  []decide.Decision
	statuses []decide.Status
}

// scratch returns a batch's working arrays for n checks, zeroed: from
// the pool, or new. The caller gives them back with release.
func (s *GRPC) scratch(n int) *batchScratch {
	sc, _ := s.batches.Get().(*batchScratch)
	if sc == nil {
		sc = &batchScratch{statuses: make([]decide.Status, 0, batchStatusRoom)}
	}
	if cap(sc.reqs) < n {
		sc.reqs = make([]decide.Request, n)
		sc.decided = make([]decide.Decision, n)
	}
	sc.reqs, sc.decided = sc.reqs[:n], sc.decided[:n]
	return sc
}

// release zeroes sc and puts it back: the pool then holds no strings of
// an answered call (they point into its message's bytes).
func (s *GRPC) release(sc *batchScratch) {
	clear(sc.reqs)
	clear(sc.decided)
	s.batches.Put(sc)
}

// batchStatusRoom is the statuses a batch's buffer has room for: more
// than most checks have limits (a check with more gets an array of its
// own).
const batchStatusRoom = 8

// undo gives back the decisions of a batch that will not be answered.
func (s *GRPC) undo(ctx context.Context, reqs []decide.Request, decided []decide.Decision) {
	u, ok := s.checker.(Undoer)
	if !ok || len(reqs) == 0 {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	for i := range reqs {
		u.Undo(uctx, &reqs[i], decided[i])
	}
}

// request is the wire request's fields as sent, for decide.Validate.
func request(in *ratelimitv1.RateLimitRequest) decide.Request {
	return decide.Request{
		Tenant: in.GetTenantId(),
		Client: in.GetClientIdentifier(),
		Route:  in.GetRoute(),
		Method: in.GetMethod(),
		IPText: in.GetIp(),
		Tier:   in.GetTier(),
		Cost:   int64(in.GetTokenCost()),
	}
}

// grpcError maps an error of decide.Validate or a Checker to its gRPC
// status: invalid input to INVALID_ARGUMENT, the caller's cancel and
// deadline to theirs, a shed call to UNAVAILABLE, anything else to
// INTERNAL. Errors of the call's own shape (appendBatch's size and its
// per-index validation, ShouldRateLimit's domain and descriptor count,
// the codec's undecodable message) are answered where they are found, as
// is CheckRateLimitBatch's INTERNAL when it cannot decode its own answer.
func grpcError(err error) error {
	var bad *decide.InvalidError
	switch {
	case errors.As(err, &bad):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case decide.IsOverloaded(err):
		// Shed: the node is overloaded, not the store; retry elsewhere.
		return status.Error(codes.Unavailable, "allot: node overloaded, request shed: "+err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// ceilMillis rounds up, so a throttled caller is never told to retry at once.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
