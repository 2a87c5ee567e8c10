package demand

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// Snapshots stay under the payload, decode on their own, and carry every
// entry exactly once.
func TestEncodeChunksAndDecodes(t *testing.T) {
	var in []Entry
	want := map[string][2]int64{}
	for i := range 5000 {
		e := Entry{Key: fmt.Sprintf("rl:{tenant=t-%05d}:api:rps", i), Admitted: int64(i), Denied: int64(i % 7)}
		in = append(in, e)
		want[e.Key] = [2]int64{e.Admitted, e.Denied}
	}
	const maxBytes = 16 << 10
	msgs := Encode("node-1", in, maxBytes)
	require.Greater(t, len(msgs), 1, "5000 keys fit no 16 KiB snapshot")
	got := map[string][2]int64{}
	for _, m := range msgs {
		require.LessOrEqual(t, proto.Size(m), maxBytes)
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		require.NoError(t, proto.Unmarshal(b, m))
		require.Equal(t, "node-1", m.GetNode())
		Decode(m, func(key string, a, d int64) {
			_, dup := got[key]
			require.False(t, dup, "key %s twice", key)
			got[key] = [2]int64{a, d}
		})
	}
	require.Equal(t, want, got)
	require.Nil(t, Encode("n", nil, maxBytes), "no demand, no snapshot")
}

// What a node publishes (Snapshots of its drains) is what the
// coordinator's Sum drains: keys without demand left out, a key drained
// twice (the leases' and the exact path's) summed, negative counts as 0.
func TestSnapshotsSum(t *testing.T) {
	drain := func(fn func(key string, admitted, denied int64)) {
		fn("rl:{a}:g:l", 3, 1)
		fn("rl:{b}:g:l", 0, 0)
		fn("rl:{c}:g:l", -2, 5)
		fn("rl:{a}:g:l", 4, 0)
	}
	snaps, err := Snapshots("n1", drain, 1<<20)
	require.NoError(t, err)
	require.Len(t, snaps, 1)
	var s Sum
	for range 2 { // delivered twice: counted twice, as a duplicated message is
		require.NoError(t, s.Add(snaps[0]))
	}
	require.Error(t, s.Add([]byte{0xff}), "not a snapshot")
	got := map[string][2]int64{}
	s.Drain(func(key string, a, d int64) { got[key] = [2]int64{a, d} })
	require.Equal(t, map[string][2]int64{"rl:{a}:g:l": {14, 2}, "rl:{c}:g:l": {0, 10}}, got)
	s.Drain(func(key string, _, _ int64) { t.Errorf("%s drained twice", key) })
	none, err := Snapshots("n1", func(func(string, int64, int64)) {}, 1<<20)
	require.NoError(t, err)
	require.Empty(t, none)
}

// Snapshots of keys that decode past frontcode.MaxDecoded in one payload
// are split so that none does; a forged snapshot that does is refused
// before its keys are decoded.
func TestSnapshotKeysDecodeWithinTheBound(t *testing.T) {
	var in []Entry
	for i := range 600 { // 38 MiB of keys, a few KiB on the wire
		in = append(in, Entry{Key: fmt.Sprintf("rl:{route=%s%05d}:p:l", strings.Repeat("a", 64<<10), i), Admitted: 1})
	}
	msgs := Encode("node-1", in, 1<<20)
	require.Greater(t, len(msgs), 1)
	var s Sum
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		require.NoError(t, s.Add(b))
	}
	n := 0
	s.Drain(func(string, int64, int64) { n++ })
	require.Equal(t, len(in), n)

	forged := &coordv1.Demand{Node: "n", Entries: []*coordv1.DemandEntry{{Suffix: strings.Repeat("k", 64<<10), Admitted: 1}}}
	for len(forged.Entries) < 300 {
		forged.Entries = append(forged.Entries, &coordv1.DemandEntry{Prefix: math.MaxUint32, Suffix: "k", Admitted: 1})
	}
	b, err := proto.Marshal(forged)
	require.NoError(t, err)
	require.Error(t, s.Add(b))
	s.Drain(func(key string, _, _ int64) { t.Errorf("%.20s... of a refused snapshot drained", key) })
}
