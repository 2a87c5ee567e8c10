// Package client is the Go client of an Allot node's gRPC API
// (hispeeddesign.ratelimit.v1.RateLimiterService).
//
// A Client connects to one or more node addresses (plaintext, TLS or
// mTLS, see WithTLS) and spreads calls round-robin over the nodes whose
// gRPC health says SERVING. On top of the two RPCs it adds:
//
//   - Coalescing: concurrent Check calls share CheckRateLimitBatch calls.
//     A Check made while no other is in flight is sent at once, on its
//     own; Checks made while one is in flight wait until it returns, the
//     batch fills (WithMaxBatch, at most MaxBatch) or WithMaxDelay passes,
//     whichever comes first. Each caller gets the answer to its own
//     request.
//   - A deny cache: a THROTTLED answer with retry_after_ms is remembered
//     under the request's identity fields (tenant, client, route, method,
//     ip, tier, token cost), and the same request is answered THROTTLED
//     locally, without an RPC, until that time. For the algorithms Allot
//     ships a denied request cannot pass earlier unless an operator resets
//     the key or changes the policy; WithDenyCache(0) turns the cache off.
//   - A per-call answer when the nodes are unreachable (UNAVAILABLE or a
//     deadline exceeded): by default the error is returned; with
//     OnUnreachable(FailOpen) the call answers FAILED_OPEN, with
//     OnUnreachable(FailClosed) THROTTLED. Both such answers are marked
//     degraded and carry LocalReason in violation_reason (see Local); a
//     local answer is never ALLOWED.
//   - One retry of a call refused with UNAVAILABLE (a node that sheds
//     load answers "node overloaded"; a node going away answers
//     UNAVAILABLE too), on the balancer's next pick: another node when
//     more than one is ready. Allot refuses such calls before counting
//     them.
//   - With WithQuota, hot identities are decided in the caller's process
//     from quota assignments the nodes give over Envoy's Rate Limit Quota
//     Service (one stream, a report each interval), with no RPC per check
//     (docs/rlqs.md, "The Go client").
//
// Errors from the node are returned as gRPC status errors, so
// status.Code(err) tells INVALID_ARGUMENT (bad input, never worth a
// retry) from the rest.
//
// It holds no policy and no limit of its own: every ALLOWED comes from a
// node's answer or from a quota assignment a node gave, and the deny
// cache only repeats a node's THROTTLED until the time the node named.
package client
