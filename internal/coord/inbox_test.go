package coord

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// firstChunk is chunk 0 of a report of chunks chunks of region us in
// round id: filed, it opens an assembly that waits for the others.
func firstChunk(t *testing.T, id roundID, chunks uint32) []byte {
	t.Helper()
	return marshalAll(t, []*coordv1.Message{{Region: "us", Epoch: id.epoch, IntervalMs: id.intervalMS, Mid: id.mid,
		Body: &coordv1.Message_Report{Report: &coordv1.ReportChunk{Chunk: 0, Chunks: chunks, Entries: []*coordv1.Entry{{Suffix: "rl:{a}:g:l"}}}}}})[0]
}

// TestForgedIntervalsKeepNoRoundForEver: whatever intervals messages
// claim, the inbox keeps at most maxRounds rounds, a round of a huge
// interval no longer than this machine's own would be kept, and this
// machine's own rounds are always filed.
func TestForgedIntervalsKeepNoRoundForEver(t *testing.T) {
	m := receiver(t) // epoch 7 of 10 s
	now := m.clock.now.UnixMilli()
	m.Step(Received{Wire: firstChunk(t, roundID{0, 1 << 40, false}, 2)}) // epoch 0 "started" 2^40 ms ago
	for iv := int64(10_001); iv <= 11_000; iv++ {
		m.Step(Received{Wire: firstChunk(t, roundID{now / iv, iv, false}, 2)})
		require.LessOrEqual(t, len(m.inbox.rounds), maxRounds)
	}
	require.NotContains(t, m.inbox.rounds, roundID{0, 1 << 40, false})

	own := roundID{7, 10_000, false}
	for _, b := range marshalAll(t, encodeReport("us", own, mixedEntries(100), 1<<20)) {
		m.Step(Received{Wire: b})
	}
	require.Contains(t, m.inbox.rounds, own)
	require.True(t, m.inbox.rounds[own].reports["us"].complete())
	require.LessOrEqual(t, len(m.inbox.rounds), maxRounds)

	m.Tick(m.clock.now.Add(40 * time.Second)) // past every round filed
	m.Step(Received{Wire: firstChunk(t, roundID{11, 10_000, false}, 2)})
	require.Len(t, m.inbox.rounds, 1, "stale rounds are kept")
}

// TestOutOfRangeRoundsAndChunksAreRefused: a report of more chunks than
// any coordinator sends, or of an interval shorter than any runs, opens
// nothing, from the wire and decoded alike.
func TestOutOfRangeRoundsAndChunksAreRefused(t *testing.T) {
	for _, b := range [][]byte{
		firstChunk(t, roundID{7, 10_000, false}, maxChunks+1),
		firstChunk(t, roundID{70_000, 1, false}, 2),
	} {
		got, want := receiver(t), receiver(t)
		got.Step(Received{Wire: b})
		msg := &coordv1.Message{}
		require.NoError(t, proto.Unmarshal(b, msg))
		want.inbox.file(msg, want.clock.now)
		require.Empty(t, got.inbox.rounds)
		require.Empty(t, want.inbox.rounds)
	}
	ok := receiver(t)
	ok.Step(Received{Wire: firstChunk(t, roundID{7, 10_000, false}, maxChunks)})
	require.Len(t, ok.inbox.rounds, 1, "a report of maxChunks chunks is refused")
}

// TestAPeersOtherIntervalIsStillFiled: during a change of interval a
// peer's round of another interval is kept, as before, within this
// machine's own window.
func TestAPeersOtherIntervalIsStillFiled(t *testing.T) {
	m := receiver(t) // at 70 s
	for _, id := range []roundID{{3, 20_000, false}, {3, 20_000, true}, {14, 5_000, false}} {
		for _, b := range marshalAll(t, encodeReport("us", id, mixedEntries(30), 1<<20)) {
			m.Step(Received{Wire: b})
		}
		require.Contains(t, m.inbox.rounds, id)
		require.True(t, m.inbox.rounds[id].reports["us"].complete())
	}
}
