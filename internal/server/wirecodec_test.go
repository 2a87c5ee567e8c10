package server_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/server"
	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// wireMessages is every message of the node's service, each with every
// field set (and some with none), for the codec round trips.
func wireMessages(rng *rand.Rand) []proto.Message {
	str := func() string {
		const alphabet = "abcXYZ019/_-=,{}:é漢\x00\xff"
		var b strings.Builder
		for range rng.IntN(12) {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	i64 := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return -rng.Int64()
		}
		return rng.Int64N(1 << uint(rng.IntN(62)+1))
	}
	req := func() *ratelimitv1.RateLimitRequest {
		return &ratelimitv1.RateLimitRequest{
			TenantId: str(), ClientIdentifier: str(), Route: str(), TokenCost: int32(i64()),
			Method: str(), Ip: str(), Tier: str(),
		}
	}
	status := func() *ratelimitv1.LimitStatus {
		return &ratelimitv1.LimitStatus{
			PolicyId: str(), LimitName: str(), Limit: i64(), Remaining: i64(), ResetAfterSeconds: i64(),
			WindowSeconds: i64(), Violated: rng.IntN(2) == 0, Exact: rng.IntN(2) == 0, Quota: i64(),
		}
	}
	statuses := func() []*ratelimitv1.LimitStatus {
		var out []*ratelimitv1.LimitStatus
		for range rng.IntN(4) {
			out = append(out, status())
		}
		return out
	}
	resp := func() *ratelimitv1.RateLimitResponse {
		return &ratelimitv1.RateLimitResponse{
			Decision: ratelimitv1.RateLimitResponse_Decision(rng.IntN(4)), Limit: i64(), Remaining: i64(),
			ResetAfterSeconds: i64(), ViolationReason: str(), RetryAfterMs: i64(), PolicyId: str(),
			Statuses: statuses(), ShadowViolations: statuses(), Degraded: rng.IntN(2) == 0,
		}
	}
	batchReq := &ratelimitv1.BatchRateLimitRequest{}
	batchResp := &ratelimitv1.BatchRateLimitResponse{}
	for range rng.IntN(6) {
		batchReq.Requests = append(batchReq.Requests, req())
		batchResp.Responses = append(batchResp.Responses, resp())
	}
	return []proto.Message{
		req(), resp(), status(), batchReq, batchResp,
		&ratelimitv1.RateLimitRequest{}, &ratelimitv1.RateLimitResponse{}, &ratelimitv1.LimitStatus{},
		&ratelimitv1.BatchRateLimitRequest{}, &ratelimitv1.BatchRateLimitResponse{},
	}
}

func marshal(t testing.TB, c encoding.CodecV2, m any) []byte {
	t.Helper()
	b, err := c.Marshal(m)
	require.NoError(t, err)
	defer b.Free()
	return b.Materialize()
}

// unmarshal decodes b into a new message like m, or returns the error.
func unmarshal(c encoding.CodecV2, b []byte, like proto.Message) (proto.Message, error) {
	m := like.ProtoReflect().New().Interface()
	// A copy: the codec may keep pointers into what it is given, and the
	// caller goes on using b.
	data := mem.BufferSlice{mem.SliceBuffer(append([]byte(nil), b...))}
	return m, c.Unmarshal(data, m)
}

// withUnknown appends fields the schema does not know (a newer peer's).
func withUnknown(b []byte, rng *rand.Rand) []byte {
	b = protowire.AppendTag(b, protowire.Number(100+rng.IntN(50)), protowire.VarintType)
	b = protowire.AppendVarint(b, rng.Uint64())
	b = protowire.AppendTag(b, 999, protowire.BytesType)
	return protowire.AppendBytes(b, []byte("unknown"))
}

// Every node message marshals to the same bytes through WireCodec as
// through grpc-go's default codec, and decodes to the same message
// (unknown fields included) through both.
func TestWireCodecRoundTripsEveryMessage(t *testing.T) {
	std, wire := encoding.GetCodecV2("proto"), server.WireCodec()
	rng := rand.New(rand.NewPCG(16, 16))
	for range 300 {
		for _, m := range wireMessages(rng) {
			want := marshal(t, std, m)
			require.Equal(t, want, marshal(t, wire, m), "%T %v", m, m)
			for _, in := range [][]byte{want, withUnknown(append([]byte(nil), want...), rng)} {
				a, err := unmarshal(std, in, m)
				require.NoError(t, err)
				b, err := unmarshal(wire, in, m)
				require.NoError(t, err)
				require.True(t, proto.Equal(a, b), "%T:\n%v\n%v", m, a, b)
				// Back to the wire: the same bytes again, unknown fields kept.
				assert.Equal(t, in, marshal(t, std, b))
				assert.Equal(t, in, marshal(t, wire, b))
			}
		}
	}
}

// A mangled message is accepted or rejected by WireCodec exactly as by
// the default codec, and what is accepted decodes the same.
func TestWireCodecAgreesOnMalformed(t *testing.T) {
	std, wire := encoding.GetCodecV2("proto"), server.WireCodec()
	rng := rand.New(rand.NewPCG(1, 6))
	for range 300 {
		for _, m := range wireMessages(rng) {
			b := marshal(t, std, m)
			if len(b) == 0 {
				continue
			}
			for range 10 {
				bad := append([]byte(nil), b...)
				switch rng.IntN(3) {
				case 0:
					bad[rng.IntN(len(bad))] = byte(rng.Uint32())
				case 1:
					bad = bad[:rng.IntN(len(bad))]
				default:
					// A known field with another wire type.
					bad = append(protowire.AppendTag(nil, protowire.Number(1+rng.IntN(10)), protowire.Type(rng.IntN(6))), bad...)
				}
				a, errA := unmarshal(std, bad, m)
				w, errW := unmarshal(wire, bad, m)
				require.Equal(t, errA == nil, errW == nil, "%T %x: %v / %v", m, bad, errA, errW)
				if errA == nil {
					require.True(t, proto.Equal(a, w), "%T %x", m, bad)
				}
			}
		}
	}
}

// Messages of other services go to the default codec unchanged.
func TestWireCodecFallsBackForOtherMessages(t *testing.T) {
	std, wire := encoding.GetCodecV2("proto"), server.WireCodec()
	m := wrapperspb.String("health and reflection are not ours")
	b := marshal(t, wire, m)
	assert.Equal(t, marshal(t, std, m), b)
	got, err := unmarshal(wire, b, m)
	require.NoError(t, err)
	assert.True(t, proto.Equal(m, got))
	assert.Equal(t, "proto", wire.Name())
}

// A decoded batch answer's statuses share arrays; appending to one
// response's statuses must not overwrite the next response's.
func TestWireCodecBatchStatusesAreCapped(t *testing.T) {
	wire := server.WireCodec()
	in := &ratelimitv1.BatchRateLimitResponse{}
	for i := range 3 {
		in.Responses = append(in.Responses, &ratelimitv1.RateLimitResponse{
			PolicyId: "p", Statuses: []*ratelimitv1.LimitStatus{{PolicyId: "p", Limit: int64(i)}},
		})
	}
	out, err := unmarshal(wire, marshal(t, wire, in), in)
	require.NoError(t, err)
	got := out.(*ratelimitv1.BatchRateLimitResponse)
	got.Responses[0].Statuses = append(got.Responses[0].Statuses, &ratelimitv1.LimitStatus{Limit: 99})
	assert.Equal(t, int64(1), got.Responses[1].Statuses[0].Limit)
	assert.Len(t, got.Responses[1].Statuses, 1)
}

// Any bytes at all are accepted or refused by WireCodec as by the
// default codec, and decode the same, for each of the node's messages:
// its own reading of the wire (wirecodec.go, plain) must never differ
// from protobuf-go's.
func FuzzWireCodecAgreesWithProtobuf(f *testing.F) {
	std, wire := encoding.GetCodecV2("proto"), server.WireCodec()
	rng := rand.New(rand.NewPCG(7, 7))
	for _, m := range wireMessages(rng) {
		f.Add(marshal(f, std, m))
	}
	f.Add([]byte{0x08, 0x80})       // a varint cut short
	f.Add([]byte{0x0a, 0x05, 0x61}) // a length past the end
	f.Add([]byte{0x00, 0x01})       // field number 0
	like := []proto.Message{
		&ratelimitv1.RateLimitRequest{}, &ratelimitv1.RateLimitResponse{}, &ratelimitv1.LimitStatus{},
		&ratelimitv1.BatchRateLimitRequest{}, &ratelimitv1.BatchRateLimitResponse{},
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range like {
			a, errA := unmarshal(std, b, m)
			w, errW := unmarshal(wire, b, m)
			require.Equal(t, errA == nil, errW == nil, "%T %x: %v / %v", m, b, errA, errW)
			if errA == nil {
				require.True(t, proto.Equal(a, w), "%T %x", m, b)
			}
		}
	})
}
