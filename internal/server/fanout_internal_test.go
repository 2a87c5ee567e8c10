package server

import (
	"bytes"
	"runtime"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	ratelimitv1 "github.com/allot-dev/allot/proto/ratelimit/v1"
)

// A message whose elements would cost far more decoded than on the wire
// is refused before it is decoded: the server's codec allocates about
// the bytes it was sent, not a message per element.
func TestFanOutIsRefusedBeforeDecoding(t *testing.T) {
	const many = 1 << 20 // 2 MiB of elements, within MaxMessageBytes
	empties := func(tag ...byte) []byte { return bytes.Repeat(append(tag, 0), many) }
	unknown := []byte{0xf8, 0x07, 0x01} // field 127, varint 1: not plain
	// One descriptor (field 2) of many entries (its field 1).
	oneDescriptor := protowire.AppendBytes([]byte{0x12}, empties(0x0a))
	c := newWireCodec(true)
	reports := &rlqsv3.RateLimitQuotaUsageReports{}
	c.bounds = []FanOut{{Message: reports.ProtoReflect().Descriptor().FullName(), Field: 2, Name: "bucket_quota_usages", Max: 16384}}
	for _, tc := range []struct {
		name string
		msg  proto.Message
		wire []byte
		want string
	}{
		{"batch", &ratelimitv1.BatchRateLimitRequest{}, empties(0x0a), "requests: 1048576 checks exceed the maximum of 1000 per call"},
		{"batch, not plain", &ratelimitv1.BatchRateLimitRequest{}, append(empties(0x0a), unknown...), "requests: 1048576 checks exceed the maximum of 1000 per call"},
		{"envoy descriptors", &rlsv3.RateLimitRequest{}, empties(0x12), "descriptors: 1048576, want 1 to 1000"},
		{"envoy entries", &rlsv3.RateLimitRequest{}, oneDescriptor, "descriptors: a descriptor of 1048576 entries; at most 6 (one per request field)"},
		{"a bound of another package", reports, empties(0x12), "bucket_quota_usages: 1048576 in one message; at most 16384"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.wire)}, tc.msg))
			runtime.ReadMemStats(&after)
			// The bytes are copied once (Materialize); decoded, they would
			// be 150 MB and more.
			assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(3*len(tc.wire)), "bytes allocated decoding %d bytes", len(tc.wire))
			u := tc.msg.ProtoReflect().GetUnknown()
			require.NotEmpty(t, u, "marked invalid")
			assert.Equal(t, byte(0), u[0], "marked invalid")
			assert.Equal(t, tc.want, string(u[1:]))
		})
	}
	// At the bounds, the messages decode.
	at := &ratelimitv1.BatchRateLimitRequest{}
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Repeat([]byte{0x0a, 0}, MaxBatch))}, at))
	assert.Len(t, at.Requests, MaxBatch)
	env := &rlsv3.RateLimitRequest{}
	six := bytes.Repeat([]byte{0x0a, 0}, maxEntries)
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(append([]byte{0x12, byte(len(six))}, six...))}, env))
	require.Len(t, env.Descriptors, 1)
	assert.Len(t, env.Descriptors[0].Entries, maxEntries)
	assert.Empty(t, env.ProtoReflect().GetUnknown())
	reports = &rlqsv3.RateLimitQuotaUsageReports{}
	require.NoError(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Repeat([]byte{0x12, 0}, 16384))}, reports))
	assert.Len(t, reports.BucketQuotaUsages, 16384)
}

// maxEntries is the most entries a descriptor can carry and be decided:
// one per request field an Envoy key sets.
func TestMaxEntriesCoversEveryEnvoyKey(t *testing.T) {
	fields := map[any]bool{}
	for _, f := range DefaultEnvoyKeys() {
		fields[f] = true
	}
	assert.Equal(t, maxEntries, len(fields))
}
