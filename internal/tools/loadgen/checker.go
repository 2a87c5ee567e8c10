package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// Checker asks one target for a decision. Implementations are safe for
// concurrent use.
type Checker interface {
	Check(ctx context.Context, req *ratelimitv1.RateLimitRequest) (Answer, error)
	Close() error
}

// Answer is what the generator keeps of a decision.
type Answer struct {
	Decision ratelimitv1.RateLimitResponse_Decision
	// Degraded: the node decided without its store (the response's
	// degraded field), e.g. from its local fallback bucket.
	Degraded bool
}

// grpcChecker spreads calls over a few connections round-robin: one
// HTTP/2 connection serialises its frames through one writer, which caps
// throughput on a many-core client.
type grpcChecker struct {
	conns   []*grpc.ClientConn
	clients []ratelimitv1.RateLimiterServiceClient
	next    atomic.Uint64
}

// DialGRPC returns a Checker calling CheckRateLimit at addr over conns
// plaintext connections. Connections are made lazily, on first use.
func DialGRPC(addr string, conns int) (Checker, error) {
	c := &grpcChecker{}
	for range max(conns, 1) {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, errors.Join(fmt.Errorf("grpc client for %s: %w", addr, err), c.Close())
		}
		c.conns = append(c.conns, cc)
		c.clients = append(c.clients, ratelimitv1.NewRateLimiterServiceClient(cc))
	}
	return c, nil
}

func (c *grpcChecker) Check(ctx context.Context, req *ratelimitv1.RateLimitRequest) (Answer, error) {
	cl := c.clients[c.next.Add(1)%uint64(len(c.clients))]
	resp, err := cl.CheckRateLimit(ctx, req)
	if err != nil {
		return Answer{}, err
	}
	return Answer{Decision: resp.GetDecision(), Degraded: resp.GetDegraded()}, nil
}

func (c *grpcChecker) Close() error {
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	return errors.Join(errs...)
}

// httpChecker posts to /v1/check.
type httpChecker struct {
	url    string
	client *http.Client
}

// NewHTTPChecker returns a Checker posting the JSON form of each request
// (proto field names) to addr's /v1/check. addr is host:port or a base
// URL. A 200 answer carries the decision; 429 is THROTTLED; any other
// status is an error. maxConns bounds the idle connections kept.
func NewHTTPChecker(addr string, maxConns int) Checker {
	base := strings.TrimSuffix(addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = max(maxConns, 2)
	tr.MaxIdleConnsPerHost = max(maxConns, 2)
	return &httpChecker{url: base + "/v1/check", client: &http.Client{Transport: tr}}
}

var jsonOpts = protojson.MarshalOptions{UseProtoNames: true}

func (c *httpChecker) Check(ctx context.Context, req *ratelimitv1.RateLimitRequest) (Answer, error) {
	body, err := jsonOpts.Marshal(req)
	if err != nil {
		return Answer{}, fmt.Errorf("encode check: %w", err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return Answer{}, fmt.Errorf("build request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(hreq)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	// Read the body whole so the connection is reused.
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Answer{}, fmt.Errorf("read answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return Answer{Decision: ratelimitv1.RateLimitResponse_THROTTLED}, nil
	case http.StatusOK:
	default:
		return Answer{}, fmt.Errorf("POST %s: status %d: %.200s", c.url, resp.StatusCode, data)
	}
	var ans struct {
		Decision string `json:"decision"`
		Degraded bool   `json:"degraded"`
	}
	if err := json.Unmarshal(data, &ans); err != nil {
		return Answer{}, fmt.Errorf("decode answer: %w", err)
	}
	if ans.Decision == "" {
		return Answer{Decision: ratelimitv1.RateLimitResponse_ALLOWED, Degraded: ans.Degraded}, nil // proto3 JSON omits the zero value
	}
	v, ok := ratelimitv1.RateLimitResponse_Decision_value[ans.Decision]
	if !ok {
		return Answer{}, fmt.Errorf("decode answer: unknown decision %q", ans.Decision)
	}
	return Answer{Decision: ratelimitv1.RateLimitResponse_Decision(v), Degraded: ans.Degraded}, nil
}

func (c *httpChecker) Close() error {
	c.client.CloseIdleConnections()
	return nil
}
