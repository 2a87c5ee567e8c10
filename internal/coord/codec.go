package coord

import (
	"math"
	"slices"
	"strings"
	"unicode/utf8"

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
// encoded Message stays under maxBytes and whose keys decode to at most
// frontcode.MaxDecoded bytes, front-coding each key against the previous
// key of its chunk.
func encodeReport(region string, id roundID, entries []entry, maxBytes int) []*coordv1.Message {
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	budget := max(maxBytes-chunkOverhead-len(region), 1024)
	var chunks [][]*coordv1.Entry
	var cur []*coordv1.Entry
	size, keys, prev := 0, 0, ""
	for _, e := range entries {
		p := frontcode.Common(prev, e.key)
		pe := &coordv1.Entry{Prefix: uint32(p), Suffix: e.key[p:], Rate: e.rate, Weight: e.weight, Share: uint32(e.share), Window: e.window, Used: e.used}
		n := proto.Size(pe)
		n += protowire.SizeTag(3) + protowire.SizeVarint(uint64(n))
		if len(cur) > 0 && (size+n > budget || keys+len(e.key) > frontcode.MaxDecoded) {
			chunks = append(chunks, cur)
			cur, size, keys = nil, 0, 0
			pe.Prefix, pe.Suffix = 0, e.key // a chunk decodes on its own
			n = proto.Size(pe)
			n += protowire.SizeTag(3) + protowire.SizeVarint(uint64(n))
		}
		cur = append(cur, pe)
		size += n
		keys += len(e.key)
		prev = e.key
	}
	chunks = append(chunks, cur) // an empty report is one empty chunk
	out := make([]*coordv1.Message, len(chunks))
	for i, c := range chunks {
		out[i] = &coordv1.Message{
			Region: region, Epoch: id.epoch, IntervalMs: id.intervalMS, Mid: id.mid,
			Body: &coordv1.Message_Report{Report: &coordv1.ReportChunk{Chunk: uint32(i), Chunks: uint32(len(chunks)), Entries: c}},
		}
	}
	return out
}

// keyBytes is how many bytes the keys of a chunk's entries decode to, or
// false past frontcode.MaxDecoded (the sender starts a new chunk before
// it: a chunk past it is forged or corrupt, and is refused undecoded).
func keyBytes(es []*coordv1.Entry) (int, bool) {
	var size frontcode.Size
	for _, e := range es {
		if !size.Add(e.GetPrefix(), len(e.GetSuffix())) {
			return size.Total, false
		}
	}
	return size.Total, true
}

// decodeEntries undoes the front coding of one chunk, whose keys keyBytes
// takes. The chunk's keys are written into one string, each entry's key a
// slice of it: one allocation per chunk rather than per key. A prefix
// longer than the previous key (a corrupt message) is cut to it, as
// frontcode.Decode does.
func decodeEntries(es []*coordv1.Entry, dst []entry) []entry {
	size, _ := keyBytes(es)
	var b strings.Builder
	b.Grow(size)
	dst = slices.Grow(dst, len(es))
	key := ""
	for _, e := range es {
		at := b.Len()
		b.WriteString(key[:min(int(e.GetPrefix()), len(key))])
		b.WriteString(e.GetSuffix())
		key = b.String()[at:] // what a Builder wrote stays as it is
		dst = append(dst, entry{key: key, rate: e.GetRate(), weight: e.GetWeight(), share: rebalance.Share(e.GetShare()), window: e.GetWindow(), used: e.GetUsed()})
	}
	return dst
}

// reportWire is a message whose body is a report chunk, as it traveled:
// its header and chunk numbers read, its entries still encoded.
type reportWire struct {
	region            string
	epoch, intervalMS int64
	mid               bool
	chunk, chunks     uint32
	body              []byte // the ReportChunk
	entries           int
}

// readReportWire reads a message whose body is a report chunk, or reports
// false: for an ack, or for a message it does not take as it comes (an
// unknown field, a wrong wire type, invalid UTF-8, a report given twice),
// which proto.Unmarshal is to decide. Only the chunk's top level is
// checked here; its entries, by check.
func readReportWire(b []byte) (w reportWire, ok bool) {
	report := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return w, false
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 || !utf8.Valid(v) {
				return w, false
			}
			w.region, b = string(v), b[n:]
		case (num == 2 || num == 3 || num == 6) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return w, false
			}
			switch num {
			case 2:
				w.epoch = int64(v)
			case 3:
				w.intervalMS = int64(v)
			default:
				w.mid = v != 0
			}
			b = b[n:]
		case num == 4 && typ == protowire.BytesType && !report: // twice: proto merges
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return w, false
			}
			w.body, b, report = v, b[n:], true
		default:
			return w, false
		}
	}
	if !report {
		return w, false
	}
	for b := w.body; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return w, false
		}
		b = b[n:]
		switch {
		case (num == 1 || num == 2) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return w, false
			}
			if num == 1 {
				w.chunk = uint32(v)
			} else {
				w.chunks = uint32(v)
			}
			b = b[n:]
		case num == 3 && typ == protowire.BytesType:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return w, false
			}
			w.entries, b = w.entries+1, b[n:]
		default:
			return w, false
		}
	}
	return w, true
}

// entriesOf yields the encoded entries of a chunk readReportWire read.
func (w reportWire) entriesOf(yield func([]byte) bool) {
	for b := w.body; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		b = b[n:]
		if num != 3 {
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if !yield(v) {
			return
		}
		b = b[n:]
	}
}

// chunk is a report chunk filed. Its entries are decoded once the report
// is complete, then into one array of the report's size, where decoding
// each on arrival and joining them after would copy the report again.
type chunk interface {
	len() int
	appendTo(dst []entry) []entry
}

// protoChunk is the entries of a decoded message's chunk.
type protoChunk []*coordv1.Entry

func (c protoChunk) len() int                     { return len(c) }
func (c protoChunk) appendTo(dst []entry) []entry { return decodeEntries(c, dst) }

// wireChunk is a chunk as it traveled, checked.
type wireChunk struct {
	w        reportWire
	keyBytes int // of its keys, front-decoded
}

// check checks every entry of the chunk as proto.Unmarshal would, or
// reports false for one it does not take as it comes (as readReportWire)
// and for keys that decode past frontcode.MaxDecoded (which file, after
// proto.Unmarshal, refuses as keyBytes does).
func (w reportWire) check() (wireChunk, bool) {
	c := wireChunk{w: w}
	var size frontcode.Size
	for v := range w.entriesOf {
		e, ok := parseEntry(v)
		if !ok || !utf8.Valid(e.suffix) || !size.Add(e.prefix, len(e.suffix)) {
			return c, false
		}
	}
	c.keyBytes = size.Total
	return c, true
}

func (c wireChunk) len() int { return c.w.entries }

// appendTo decodes the entries as decodeEntries does a decoded chunk's,
// the keys into one string.
func (c wireChunk) appendTo(dst []entry) []entry {
	var b strings.Builder
	b.Grow(c.keyBytes)
	dst = slices.Grow(dst, c.w.entries)
	key := ""
	for v := range c.w.entriesOf {
		e, _ := parseEntry(v)
		at := b.Len()
		b.WriteString(key[:min(int(e.prefix), len(key))])
		b.Write(e.suffix)
		key = b.String()[at:] // what a Builder wrote stays as it is
		dst = append(dst, entry{key: key, rate: e.rate, weight: e.weight, share: rebalance.Share(e.share), window: e.window, used: e.used})
	}
	return dst
}

// wireEntry is an Entry's fields, its suffix a slice of the message.
type wireEntry struct {
	prefix       uint32
	suffix       []byte
	rate, weight float32
	share        uint32
	window       int64
	used         uint64
}

// parseEntry reads an encoded Entry (its suffix unchecked), or reports
// false for one it does not take as it comes.
func parseEntry(b []byte) (e wireEntry, ok bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return e, false
		}
		b = b[n:]
		switch {
		case num == 2 && typ == protowire.BytesType:
			if e.suffix, n = protowire.ConsumeBytes(b); n < 0 {
				return e, false
			}
		case (num == 3 || num == 4) && typ == protowire.Fixed32Type:
			v, m := protowire.ConsumeFixed32(b)
			if num == 3 {
				e.rate = math.Float32frombits(v)
			} else {
				e.weight = math.Float32frombits(v)
			}
			n = m
		case (num == 1 || num >= 5 && num <= 7) && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			switch num {
			case 1:
				e.prefix = uint32(v)
			case 5:
				e.share = uint32(v)
			case 6:
				e.window = int64(v)
			case 7:
				e.used = v
			}
			n = m
		default:
			return e, false
		}
		if n < 0 {
			return e, false
		}
		b = b[n:]
	}
	return e, true
}
