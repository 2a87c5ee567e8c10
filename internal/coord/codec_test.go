package coord

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/frontcode"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// mixedEntries is a report of rate and quota entries whose keys share
// prefixes of every length, some of them not ASCII.
func mixedEntries(n int) []entry {
	es := make([]entry, n)
	for i := range es {
		key := fmt.Sprintf("rl:{tenant=t-%d}:api-global:rps", i*7919%n)
		if i%5 == 0 {
			key = fmt.Sprintf("rl:{région=%d}:über:req", i)
		}
		es[i] = entry{key: key, rate: float32(i) / 3, weight: float32(i) / 7, share: rebalance.Share(i * 1000)}
		if i%4 == 0 {
			es[i] = entry{key: key + "-q", window: int64(i), used: uint64(i * i)}
		}
	}
	return es
}

func marshalAll(t *testing.T, msgs []*coordv1.Message) [][]byte {
	t.Helper()
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

// receiver is a machine of region eu among ap, eu and us, its clock at
// the start of epoch 7 of 10 s.
func receiver(t *testing.T) *Machine {
	t.Helper()
	m, err := NewMachine(MachineConfig{Region: "eu", Regions: []string{"ap", "eu", "us"}, Limits: testLimits, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	m.Tick(time.UnixMilli(7 * 10_000))
	return m
}

func TestReportRoundTripsInChunksUnderMaxPayload(t *testing.T) {
	const maxPayload = 4096
	es := mixedEntries(2000)
	msgs := encodeReport("us", roundID{7, 10_000, false}, slices.Clone(es), maxPayload)
	if len(msgs) < 10 {
		t.Fatalf("%d chunks: the test wants a report of many chunks", len(msgs))
	}
	wire, decoded := receiver(t), receiver(t)
	for i, b := range marshalAll(t, msgs) {
		if len(b) > maxPayload {
			t.Errorf("chunk %d is %d bytes, over the max payload %d", i, len(b), maxPayload)
		}
		if _, ok := readReportWire(b); !ok {
			t.Fatalf("chunk %d, as encodeReport makes it, is not read from the wire", i)
		}
		wire.Step(Received{Wire: b})
		decoded.inbox.file(msgs[i], decoded.clock.now)
	}
	slices.SortFunc(es, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	for name, m := range map[string]*Machine{"wire": wire, "decoded": decoded} {
		a := m.inbox.rounds[roundID{7, 10_000, false}].reports["us"]
		if a == nil || !a.complete() || !slices.Equal(a.entries, es) || !slices.Equal(a.keyed, es) {
			t.Errorf("%s: the report filed is not the one encoded", name)
		}
	}
}

// sameEntries compares entries bit for bit (a corrupted rate may be NaN).
func sameEntries(a, b []entry) bool {
	return slices.EqualFunc(a, b, func(x, y entry) bool {
		return x.key == y.key && math.Float32bits(x.rate) == math.Float32bits(y.rate) && math.Float32bits(x.weight) == math.Float32bits(y.weight) &&
			x.share == y.share && x.window == y.window && x.used == y.used
	})
}

// sameRounds describes how the rounds of a and b differ, or is "".
func sameRounds(a, b *Machine) string {
	if len(a.inbox.rounds) != len(b.inbox.rounds) {
		return fmt.Sprintf("%d rounds, %d rounds", len(a.inbox.rounds), len(b.inbox.rounds))
	}
	for id, ra := range a.inbox.rounds {
		rb := b.inbox.rounds[id]
		if rb == nil || len(ra.reports) != len(rb.reports) || len(ra.acks) != len(rb.acks) {
			return fmt.Sprintf("round %v: %v, %v", id, ra, rb)
		}
		for from, x := range ra.reports {
			y := rb.reports[from]
			if y == nil || x.chunks != y.chunks || x.done != y.done || len(x.parts) != len(y.parts) ||
				!sameEntries(x.entries, y.entries) || !sameEntries(x.keyed, y.keyed) {
				return fmt.Sprintf("round %v, report of %s: %+v, %+v", id, from, x, y)
			}
			for ch, p := range x.parts {
				if q, ok := y.parts[ch]; !ok || !sameEntries(p.appendTo(nil), q.appendTo(nil)) {
					return fmt.Sprintf("round %v, report of %s, chunk %d differs", id, from, ch)
				}
			}
		}
		for from, x := range ra.acks {
			if !proto.Equal(x, rb.acks[from]) {
				return fmt.Sprintf("round %v, ack of %s: %v, %v", id, from, x, rb.acks[from])
			}
		}
	}
	return ""
}

// TestWireIsFiledAsTheDecodedMessage: a machine given messages as they
// traveled (decoded straight into its entries) files what one given the
// messages proto.Unmarshal decodes files, and drops what it cannot decode:
// for reports and acks, in any order, repeated, and corrupted.
func TestWireIsFiledAsTheDecodedMessage(t *testing.T) {
	var wire [][]byte
	for _, from := range []string{"ap", "us", "eu"} {
		wire = append(wire, marshalAll(t, encodeReport(from, roundID{7, 10_000, false}, mixedEntries(150), 1024))...)
	}
	wire = append(wire, marshalAll(t, encodeReport("us", roundID{7, 10_000, true}, mixedEntries(40), 1024))...) // a mid-interval round's
	wire = append(wire, marshalAll(t, []*coordv1.Message{
		{Region: "ap", Epoch: 7, IntervalMs: 10_000, Body: &coordv1.Message_Ack{Ack: &coordv1.Ack{Heard: []string{"ap", "us"}, Ok: true}}},
		{Region: "ap", Epoch: 7, IntervalMs: 10_000, Mid: true, Body: &coordv1.Message_Ack{Ack: &coordv1.Ack{Heard: []string{"ap", "eu", "us"}, Ok: true}}},
		{Region: "us", Epoch: 7, IntervalMs: 10_000, Body: &coordv1.Message_Report{Report: &coordv1.ReportChunk{Chunk: 9, Chunks: 2}}},
		{Region: "ap", Epoch: 7, IntervalMs: 10_000},
		{Region: "us", Epoch: 1, IntervalMs: 10_000, Body: &coordv1.Message_Report{Report: &coordv1.ReportChunk{Chunks: 1}}},
	})...)
	r := rand.New(rand.NewPCG(1, 2))
	fast := 0
	for range 300 {
		got, want := receiver(t), receiver(t)
		for range 40 {
			b := slices.Clone(wire[r.IntN(len(wire))])
			switch k := r.IntN(8); {
			case k == 0:
				b = b[:r.IntN(len(b)+1)]
			case k == 1:
				b = slices.Insert(b, r.IntN(len(b)+1), byte(r.IntN(256)))
			case k <= 4:
				for range 1 + r.IntN(3) {
					b[r.IntN(len(b))] ^= 1 << r.IntN(8)
				}
			}
			if w, ok := readReportWire(b); ok {
				if _, ok := w.check(); ok {
					fast++
				}
			}
			got.Step(Received{Wire: b})
			if msg := (&coordv1.Message{}); proto.Unmarshal(b, msg) == nil {
				want.inbox.file(msg, want.clock.now)
			}
			if d := sameRounds(got, want); d != "" {
				t.Fatalf("after %x:\nfrom the wire / decoded: %s", b, d)
			}
		}
	}
	if fast < 2000 {
		t.Fatalf("only %d messages were decoded from the wire: the comparison proves little", fast)
	}
}

// TestDecodeEntriesCutsACorruptPrefix: a prefix longer than the previous
// key is cut to it, as frontcode.Decode does, rather than panic, whether
// the chunk is decoded from the wire or from the decoded message.
func TestDecodeEntriesCutsACorruptPrefix(t *testing.T) {
	es := []*coordv1.Entry{{Prefix: 9, Suffix: "abc"}, {Prefix: 2, Suffix: "x"}, {Prefix: 99, Suffix: "yz"}, {Prefix: 0, Suffix: ""}, {Prefix: 1, Suffix: "q"}}
	msg := &coordv1.Message{Region: "us", Epoch: 7, IntervalMs: 10_000, Body: &coordv1.Message_Report{Report: &coordv1.ReportChunk{Chunks: 1, Entries: es}}}
	w, ok := readReportWire(marshalAll(t, []*coordv1.Message{msg})[0])
	if !ok {
		t.Fatal("the chunk is not read from the wire")
	}
	c, ok := w.check()
	if !ok {
		t.Fatal("the chunk's entries are not decoded from the wire")
	}
	fromWire := c.appendTo(nil)
	decoded := decodeEntries(es, nil)
	prev := ""
	for i, e := range es {
		want := frontcode.Decode(prev, e.GetPrefix(), e.GetSuffix())
		if i == 0 {
			want = e.GetSuffix() // no previous key in the chunk
		}
		if decoded[i].key != want || fromWire[i].key != want {
			t.Errorf("entry %d: keys %q (decoded), %q (wire), want %q", i, decoded[i].key, fromWire[i].key, want)
		}
		prev = want
	}
}

// TestReportAssemblesInChunkOrder: chunks arriving in any order give the
// report in key order, and a key given twice keeps its last entry.
func TestReportAssemblesInChunkOrder(t *testing.T) {
	es := mixedEntries(500)
	msgs := encodeReport("eu", roundID{1, 1000, false}, slices.Clone(es), 2048)
	want := slices.Clone(es)
	slices.SortFunc(want, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		a := &assembly{chunks: uint32(len(msgs)), parts: map[uint32]chunk{}}
		for _, i := range r.Perm(len(msgs)) {
			if a.complete() {
				t.Fatal("complete before its last chunk")
			}
			a.add(uint32(i), protoChunk(msgs[i].GetReport().GetEntries()))
		}
		if !a.complete() || !slices.Equal(a.keyed, want) {
			t.Fatal("the assembled report is not the sorted entries")
		}
	}
	dup := []entry{{key: "b", rate: 1}, {key: "a", rate: 2}, {key: "b", rate: 3}, {key: "a", rate: 4}}
	if got := byKey(dup); !slices.Equal(got, []entry{{key: "a", rate: 4}, {key: "b", rate: 3}}) {
		t.Fatalf("byKey(%v) = %v", dup, got)
	}
}

// FuzzFileWire: any bytes from the network are filed from the wire as the
// message proto.Unmarshal decodes from them is, or dropped as it is, and
// never panic.
func FuzzFileWire(f *testing.F) {
	for _, m := range encodeReport("us", roundID{7, 10_000, false}, mixedEntries(40), 512) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, want := receiver(t), receiver(t)
		got.Step(Received{Wire: b})
		if msg := (&coordv1.Message{}); proto.Unmarshal(b, msg) == nil {
			want.inbox.file(msg, want.clock.now)
		}
		if d := sameRounds(got, want); d != "" {
			t.Fatalf("from the wire / decoded: %s", d)
		}
	})
}

// longKeys are n keys of size bytes that differ in their last bytes: each
// travels in a few bytes after the first, and the chunk's keys decode to
// about n·size bytes.
func longKeys(n, size int) []entry {
	es := make([]entry, n)
	for i := range es {
		es[i] = entry{key: fmt.Sprintf("rl:{route=%s%05d}:p:l", strings.Repeat("a", size), i), rate: 1, weight: 1}
	}
	return es
}

// TestChunkKeysDecodeWithinTheBound: a report whose keys decode past
// frontcode.MaxDecoded in one payload is split so that no chunk does, and
// the receiver assembles it whole.
func TestChunkKeysDecodeWithinTheBound(t *testing.T) {
	es := longKeys(600, 64<<10) // 38 MiB of keys, a few KiB on the wire
	msgs := encodeReport("us", roundID{7, 10_000, false}, slices.Clone(es), 1<<20)
	require.Greater(t, len(msgs), 1)
	m := receiver(t)
	for _, b := range marshalAll(t, msgs) {
		require.LessOrEqual(t, len(b), 1<<20)
		m.Step(Received{Wire: b})
	}
	for _, msg := range msgs {
		n, ok := keyBytes(msg.GetReport().GetEntries())
		require.True(t, ok, "a chunk's keys decode to %d bytes", n)
	}
	a := m.inbox.rounds[roundID{7, 10_000, false}].reports["us"]
	require.NotNil(t, a)
	require.True(t, a.complete())
	require.Len(t, a.keyed, len(es))
}

// TestChunkKeysPastTheBoundAreRefused: a forged chunk whose every key
// repeats the previous one and adds a byte decodes past
// frontcode.MaxDecoded from a few hundred KiB: it is refused, from the
// wire and decoded alike, before its keys are decoded.
func TestChunkKeysPastTheBoundAreRefused(t *testing.T) {
	es := []*coordv1.Entry{{Suffix: strings.Repeat("k", 64<<10)}}
	for len(es) < 300 {
		es = append(es, &coordv1.Entry{Prefix: math.MaxUint32, Suffix: "k"})
	}
	n, ok := keyBytes(es)
	require.False(t, ok, "%d bytes", n)
	msg := &coordv1.Message{Region: "us", Epoch: 7, IntervalMs: 10_000, Body: &coordv1.Message_Report{Report: &coordv1.ReportChunk{Chunks: 1, Entries: es}}}
	b := marshalAll(t, []*coordv1.Message{msg})[0]
	require.Less(t, len(b), 128<<10)
	got, want := receiver(t), receiver(t)
	got.Step(Received{Wire: b})
	want.inbox.file(msg, want.clock.now)
	for _, m := range []*Machine{got, want} {
		require.Empty(t, m.inbox.rounds, "the chunk was filed")
	}
}
