package client

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// call is one Check waiting in the coalescer.
type call struct {
	req      *ratelimitv1.RateLimitRequest
	deadline time.Time // zero: the client's timeout
	res      chan result
}

type result struct {
	resp *ratelimitv1.RateLimitResponse
	err  error
}

// submit sends req on its own when nothing else is in flight, else queues
// it for the next batch.
func (c *Client) submit(ctx context.Context, req *ratelimitv1.RateLimitRequest) (*ratelimitv1.RateLimitResponse, error) {
	ctx, cancel := c.bound(ctx)
	defer cancel()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if c.cfg.maxBatch == 1 || c.inflight == 0 {
		// No one to wait for: no added latency.
		c.inflight++
		c.sends.Add(1) // Close waits for it too
		c.mu.Unlock()
		defer c.sends.Done()
		resp, err := c.unary(ctx, req)
		c.finish()
		return resp, err
	}
	cl := &call{req: req, res: make(chan result, 1)}
	cl.deadline, _ = ctx.Deadline()
	c.pending = append(c.pending, cl)
	switch {
	case len(c.pending) >= c.cfg.maxBatch:
		c.flushLocked()
	case len(c.pending) == 1:
		gen := c.gen
		c.timer = time.AfterFunc(c.cfg.maxDelay, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.gen == gen && len(c.pending) > 0 {
				c.flushLocked()
			}
		})
	}
	c.mu.Unlock()
	select {
	case r := <-cl.res:
		return r.resp, r.err
	case <-ctx.Done():
		// The batch may still carry the check; its answer is dropped.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// finish ends one call of the coalescer; the checks that queued behind it
// go now rather than at their max delay.
func (c *Client) finish() {
	c.mu.Lock()
	c.inflight--
	if len(c.pending) > 0 {
		c.flushLocked()
	}
	c.mu.Unlock()
}

// flushLocked sends the pending checks in a goroutine the client owns
// (Close waits for it). c.mu is held.
func (c *Client) flushLocked() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	c.gen++
	batch := c.pending
	c.pending = nil
	c.inflight++
	c.sends.Add(1)
	go func() {
		defer c.sends.Done()
		c.send(batch)
		c.finish()
	}()
}

// send asks the node for batch and hands each caller its answer. The
// call's deadline is the latest of its callers'.
func (c *Client) send(batch []*call) {
	now := time.Now()
	var deadline time.Time
	live := batch[:0:0]
	for _, cl := range batch {
		d := cl.deadline
		if d.IsZero() {
			d = now.Add(c.cfg.timeout)
		}
		if !d.After(now) {
			// Its caller has gone: do not count a check nobody reads.
			cl.res <- result{err: status.Error(codes.DeadlineExceeded, "allot client: deadline exceeded in the batch queue")}
			continue
		}
		deadline = later(deadline, d)
		live = append(live, cl)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if len(live) == 1 {
		resp, err := c.unary(ctx, live[0].req)
		live[0].res <- result{resp, err}
		return
	}
	in := &ratelimitv1.BatchRateLimitRequest{Requests: make([]*ratelimitv1.RateLimitRequest, len(live))}
	for i, cl := range live {
		in.Requests[i] = cl.req
	}
	resp, err := c.batch(ctx, in)
	if status.Code(err) == codes.InvalidArgument {
		// One bad check fails a batch before anything is counted: ask
		// each on its own so that only the bad one gets the error.
		for _, cl := range live {
			r, err := c.unary(ctx, cl.req)
			cl.res <- result{r, err}
		}
		return
	}
	for i, cl := range live {
		if err != nil {
			cl.res <- result{err: err}
		} else {
			cl.res <- result{resp: resp.Responses[i]}
		}
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
