package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health" // registers client-side health checking, used by the service config
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// MaxBatch is the most checks the node accepts in one CheckRateLimitBatch
// call (server.MaxBatch); batches are never larger.
const MaxBatch = 1000

// Defaults of the options.
const (
	DefaultMaxDelay  = 500 * time.Microsecond
	DefaultTimeout   = 5 * time.Second
	DefaultDenyCache = 100_000
)

// LocalReason starts the violation_reason of an answer the client made up
// because no node could be reached (FailOpen, FailClosed).
const LocalReason = "allot client: node unreachable: "

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("allot client: closed")

// FailureMode says what a call answers when no node can be reached.
type FailureMode int

const (
	// FailError returns the error (the default).
	FailError FailureMode = iota
	// FailOpen answers FAILED_OPEN, degraded, with LocalReason.
	FailOpen
	// FailClosed answers THROTTLED, degraded, with LocalReason.
	FailClosed
)

// Option configures a Client.
type Option func(*config)

type config struct {
	tls       *tls.Config
	dialOpts  []grpc.DialOption
	maxBatch  int
	maxDelay  time.Duration
	timeout   time.Duration
	denySize  int
	now       func() time.Time
	onFailure FailureMode
	health    bool
	quota     *Quota
	clockSet  bool
}

// WithTLS speaks TLS with cfg (the node's CA in RootCAs). For mTLS put the
// client certificate in cfg.Certificates or cfg.GetClientCertificate;
// package tlsconfig builds such configs from PEM files. Without WithTLS
// the client speaks plaintext.
func WithTLS(cfg *tls.Config) Option { return func(c *config) { c.tls = cfg } }

// WithDialOptions adds grpc dial options (interceptors, keepalive, ...)
// after the client's own.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) { c.dialOpts = append(c.dialOpts, opts...) }
}

// WithMaxBatch bounds the checks coalesced into one batch call; it is
// clamped to 1..MaxBatch, and 1 turns coalescing off.
func WithMaxBatch(n int) Option { return func(c *config) { c.maxBatch = max(1, min(n, MaxBatch)) } }

// WithMaxDelay bounds how long a Check waits for others to join its batch
// while another call is in flight (DefaultMaxDelay).
func WithMaxDelay(d time.Duration) Option { return func(c *config) { c.maxDelay = d } }

// WithTimeout bounds calls whose context has no deadline (DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithDenyCache bounds the deny cache to n keys (DefaultDenyCache); 0
// turns it off.
func WithDenyCache(n int) Option { return func(c *config) { c.denySize = n } }

// WithClock sets the clock of the deny cache and of quota assignments
// (time.Now; quotas read a 1 ms coarse clock by default), for tests.
func WithClock(now func() time.Time) Option {
	return func(c *config) { c.now, c.clockSet = now, true }
}

// WithFailureMode sets the FailureMode of calls that do not choose one
// with OnUnreachable (FailError).
func WithFailureMode(m FailureMode) Option { return func(c *config) { c.onFailure = m } }

// WithoutHealthCheck stops watching the nodes' gRPC health, for nodes
// behind a proxy that does not forward it.
func WithoutHealthCheck() Option { return func(c *config) { c.health = false } }

// CallOption configures one Check or CheckBatch call.
type CallOption func(*FailureMode)

// OnUnreachable sets what this call answers when no node can be reached.
func OnUnreachable(m FailureMode) CallOption { return func(f *FailureMode) { *f = m } }

// Client checks with Allot nodes. It is safe for concurrent use; Close it
// when done.
type Client struct {
	cfg  config
	conn *grpc.ClientConn
	rpc  ratelimitv1.RateLimiterServiceClient
	deny *denyCache
	// quota decides hot identities in process (WithQuota); nil without.
	quota *quota

	mu       sync.Mutex
	pending  []*call
	inflight int // calls sent by the coalescer and not yet returned
	gen      uint64
	timer    *time.Timer
	closed   bool
	sends    sync.WaitGroup // the goroutines sending batches
}

// serviceName is the health service a node reports SERVING while it takes
// checks (NOT_SERVING while draining).
var serviceName = ratelimitv1.RateLimiterService_ServiceDesc.ServiceName

// New connects to the nodes at addrs (host:port each). It does not wait
// for a connection: calls wait for a ready node up to their deadline.
func New(addrs []string, opts ...Option) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("allot client: no node address")
	}
	cfg := config{maxBatch: MaxBatch, maxDelay: DefaultMaxDelay, timeout: DefaultTimeout, denySize: DefaultDenyCache, now: time.Now, health: true}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxDelay < 0 || cfg.timeout <= 0 || cfg.denySize < 0 {
		return nil, errors.New("allot client: negative delay, size or non-positive timeout")
	}
	state := resolver.State{}
	for _, a := range addrs {
		if strings.TrimSpace(a) == "" {
			return nil, errors.New("allot client: empty node address")
		}
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil, fmt.Errorf("allot client: node address %q: %w", a, err)
		}
		// TLS checks each node's certificate against its own host, not
		// the channel's made-up authority ("nodes"); cfg.ServerName, when
		// set, still wins.
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a, ServerName: host})
	}
	// A manual resolver per client: the addresses are fixed, and grpc's
	// round_robin balancer with health checking does the rest.
	r := manual.NewBuilderWithScheme("allot")
	r.InitialState(state)
	sc := `{"loadBalancingConfig":[{"round_robin":{}}]`
	if cfg.health {
		sc += `,"healthCheckConfig":{"serviceName":"` + serviceName + `"}`
	}
	sc += "}"
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if cfg.tls != nil {
		creds = credentials.NewTLS(cfg.tls)
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(sc),
		// A full batch answer with statuses can pass grpc's 4 MiB default.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}, cfg.dialOpts...)
	conn, err := grpc.NewClient("allot:///nodes", dial...)
	if err != nil {
		return nil, fmt.Errorf("allot client: dial %v: %w", addrs, err)
	}
	c := &Client{cfg: cfg, conn: conn, rpc: ratelimitv1.NewRateLimiterServiceClient(conn), deny: newDenyCache(cfg.denySize)}
	if cfg.quota != nil {
		c.quota = newQuota(*cfg.quota, cfg, rlqsv3.NewRateLimitQuotaServiceClient(conn))
	}
	return c, nil
}

// Close sends the checks still waiting for a batch, waits for the calls
// in flight and closes the connections.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	if len(c.pending) > 0 {
		c.flushLocked()
	}
	c.mu.Unlock()
	c.sends.Wait()
	if c.quota != nil {
		c.quota.close()
	}
	return c.conn.Close()
}

// Check asks for one decision. The answer may come from the deny cache
// (THROTTLED, retry fields counted down) or, when no node is reachable and
// the call's FailureMode says so, be made up locally (see Local).
func (c *Client) Check(ctx context.Context, req *ratelimitv1.RateLimitRequest, opts ...CallOption) (*ratelimitv1.RateLimitResponse, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "allot client: nil request")
	}
	key := keyOf(req)
	if c.quota != nil {
		now := c.quota.now()
		if b := c.quota.live(key, req, now); b != nil {
			out := new(ratelimitv1.RateLimitResponse)
			if b.decide(now, out) {
				return out, nil
			}
		}
	}
	return c.check(ctx, req, key, c.mode(opts))
}

// CheckTo is Check with the answer written into out. With WithQuota, an
// identity decided in process from its assignment allocates nothing.
func (c *Client) CheckTo(ctx context.Context, req *ratelimitv1.RateLimitRequest, out *ratelimitv1.RateLimitResponse, opts ...CallOption) error {
	if req == nil {
		return status.Error(codes.InvalidArgument, "allot client: nil request")
	}
	key := keyOf(req)
	if c.quota != nil {
		now := c.quota.now()
		if b := c.quota.live(key, req, now); b != nil && b.decide(now, out) {
			return nil
		}
	}
	resp, err := c.check(ctx, req, key, c.mode(opts))
	if err != nil {
		return err
	}
	out.Reset()
	proto.Merge(out, resp)
	return nil
}

// check is Check past the quota: the deny cache, then a node.
func (c *Client) check(ctx context.Context, req *ratelimitv1.RateLimitRequest, key denyKey, mode FailureMode) (*ratelimitv1.RateLimitResponse, error) {
	if resp, ok := c.deny.get(key, c.cfg.now()); ok {
		return resp, nil
	}
	resp, err := c.submit(ctx, req)
	if err != nil {
		return c.failed(err, mode)
	}
	c.deny.put(key, resp, c.cfg.now())
	return resp, nil
}

// CheckBatch asks for a decision for each of reqs, answers[i] for reqs[i],
// in as few CheckRateLimitBatch calls of at most MaxBatch checks as it
// can (it does not wait for other callers). Requests in the deny cache are
// answered locally. If a later call fails after an earlier one was
// answered, the error is returned and the earlier checks stay counted.
func (c *Client) CheckBatch(ctx context.Context, reqs []*ratelimitv1.RateLimitRequest, opts ...CallOption) ([]*ratelimitv1.RateLimitResponse, error) {
	mode := c.mode(opts)
	out := make([]*ratelimitv1.RateLimitResponse, len(reqs))
	var ask []int
	now := c.cfg.now()
	for i, r := range reqs {
		if r == nil {
			return nil, status.Errorf(codes.InvalidArgument, "allot client: requests[%d]: nil request", i)
		}
		if resp, ok := c.deny.get(keyOf(r), now); ok {
			out[i] = resp
		} else {
			ask = append(ask, i)
		}
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	for len(ask) > 0 {
		chunk := ask[:min(len(ask), MaxBatch)]
		ask = ask[len(chunk):]
		in := &ratelimitv1.BatchRateLimitRequest{Requests: make([]*ratelimitv1.RateLimitRequest, len(chunk))}
		for j, i := range chunk {
			in.Requests[j] = reqs[i]
		}
		resp, err := c.batch(ctx, in)
		if err != nil {
			local, lerr := c.failed(err, mode)
			if lerr != nil {
				return nil, lerr
			}
			for _, i := range chunk {
				out[i] = local
			}
			continue
		}
		now := c.cfg.now()
		for j, i := range chunk {
			out[i] = resp.Responses[j]
			c.deny.put(keyOf(reqs[i]), out[i], now)
		}
	}
	return out, nil
}

// Local reports whether resp was made up by the client because no node
// could be reached, rather than decided by a node.
func Local(resp *ratelimitv1.RateLimitResponse) bool {
	return strings.HasPrefix(resp.GetViolationReason(), LocalReason)
}

func (c *Client) mode(opts []CallOption) FailureMode {
	m := c.cfg.onFailure
	for _, o := range opts {
		o(&m)
	}
	return m
}

// failed turns err into the call's answer: a local one when no node was
// reachable and mode asks for it, else the error itself (a gRPC status
// error from the node is returned as is, so status.Code works on it).
func (c *Client) failed(err error, mode FailureMode) (*ratelimitv1.RateLimitResponse, error) {
	if mode == FailError || !unreachable(err) {
		return nil, err
	}
	d := ratelimitv1.RateLimitResponse_FAILED_OPEN
	if mode == FailClosed {
		d = ratelimitv1.RateLimitResponse_THROTTLED
	}
	return &ratelimitv1.RateLimitResponse{Decision: d, Degraded: true, ViolationReason: LocalReason + err.Error()}, nil
}

func unreachable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// bound gives ctx the client's timeout when it has no deadline.
func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.cfg.timeout)
}

// retryable: refused before counting (shed, draining) or not sent (the
// picked node went away); round_robin's next pick is another node when
// several are ready.
func retryable(ctx context.Context, err error) bool {
	return status.Code(err) == codes.Unavailable && ctx.Err() == nil
}

func (c *Client) unary(ctx context.Context, req *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
	resp, err := c.rpc.CheckRateLimit(ctx, req)
	if err != nil && retryable(ctx, err) {
		resp, err = c.rpc.CheckRateLimit(ctx, req)
	}
	return resp, err
}

func (c *Client) batch(ctx context.Context, in *ratelimitv1.BatchRateLimitRequest) (*ratelimitv1.BatchRateLimitResponse, error) {
	resp, err := c.rpc.CheckRateLimitBatch(ctx, in)
	if err != nil && retryable(ctx, err) {
		resp, err = c.rpc.CheckRateLimitBatch(ctx, in)
	}
	if err == nil && len(resp.GetResponses()) != len(in.GetRequests()) {
		return nil, status.Errorf(codes.Internal, "allot client: %d answers to %d checks", len(resp.GetResponses()), len(in.GetRequests()))
	}
	return resp, err
}
