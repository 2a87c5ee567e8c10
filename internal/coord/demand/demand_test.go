package demand

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
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
