package coord

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/frontcode"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// entry is one key of a report, decoded.
type entry struct {
	key    string
	rate   float32
	weight float32
	share  rebalance.Share // 0: the default
	// window (> 0) and used carry a global quota's count instead.
	window int64
	used   uint64
}

// chunkOverhead is room left in every chunk for the message around the
// entries (region, epoch, chunk numbers).
const chunkOverhead = 256

// encodeReport splits entries (sorted here by key) into chunks whose
// encoded Message stays under maxBytes, front-coding each key against the
// previous key of its chunk.
func encodeReport(region string, epoch, intervalMS int64, entries []entry, maxBytes int) []*coordv1.Message {
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	budget := max(maxBytes-chunkOverhead-len(region), 1024)
	var chunks [][]*coordv1.Entry
	var cur []*coordv1.Entry
	size, prev := 0, ""
	for _, e := range entries {
		p := frontcode.Common(prev, e.key)
		pe := &coordv1.Entry{Prefix: uint32(p), Suffix: e.key[p:], Rate: e.rate, Weight: e.weight, Share: uint32(e.share), Window: e.window, Used: e.used}
		n := proto.Size(pe)
		n += protowire.SizeTag(3) + protowire.SizeVarint(uint64(n))
		if len(cur) > 0 && size+n > budget {
			chunks = append(chunks, cur)
			cur, size = nil, 0
			pe.Prefix, pe.Suffix = 0, e.key // a chunk decodes on its own
			n = proto.Size(pe)
			n += protowire.SizeTag(3) + protowire.SizeVarint(uint64(n))
		}
		cur = append(cur, pe)
		size += n
		prev = e.key
	}
	chunks = append(chunks, cur) // an empty report is one empty chunk
	out := make([]*coordv1.Message, len(chunks))
	for i, c := range chunks {
		out[i] = &coordv1.Message{
			Region: region, Epoch: epoch, IntervalMs: intervalMS,
			Body: &coordv1.Message_Report{Report: &coordv1.ReportChunk{Chunk: uint32(i), Chunks: uint32(len(chunks)), Entries: c}},
		}
	}
	return out
}

// decodeEntries undoes the front coding of one chunk.
func decodeEntries(es []*coordv1.Entry, dst []entry) []entry {
	prev := ""
	for _, e := range es {
		key := frontcode.Decode(prev, e.GetPrefix(), e.GetSuffix())
		dst = append(dst, entry{key: key, rate: e.GetRate(), weight: e.GetWeight(), share: rebalance.Share(e.GetShare()), window: e.GetWindow(), used: e.GetUsed()})
		prev = key
	}
	return dst
}
