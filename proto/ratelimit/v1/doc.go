// Package ratelimitv1 holds the Go types of the node's public gRPC API,
// hispeeddesign.ratelimit.v1: RateLimiterService (CheckRateLimit and
// CheckRateLimitBatch) and its messages, a check's request, its
// response with one LimitStatus per applied limit, and their batches.
//
// ratelimit.proto, beside this file, is the public contract: clients in
// any language build from it, and what the seed defined (fields 1-4 of
// the request, 1-5 of the response, the Decision values) never changes:
// later fields only add.
// Every other Go file here is generated from it by buf (`make proto`:
// buf.gen.yaml for the messages and the gRPC service,
// buf.gen.vtproto.yaml through scripts/vtproto.sh for the vtprotobuf
// marshalling server.WireCodec uses) and must not be edited by hand:
// change the .proto and regenerate.
package ratelimitv1
