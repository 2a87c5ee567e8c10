package coord

import (
	"log/slog"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/allot-dev/allot/internal/frontcode"
	"github.com/allot-dev/allot/policy"
	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
)

// The inbox: report chunks from every region reassembled into rounds,
// and what a round has heard.

// inbox is the other regions' reports and acks, by round, and the last
// complete report heard from each, one entry per key in key order: the
// shares of a region not heard this epoch.
type inbox struct {
	self    string   // this region, whose own messages come back and are ignored
	regions []string // every region, sorted
	// own are the intervals (ms) this machine runs: its round's under way
	// and its knobs' (the same but across a change of interval).
	own    [2]int64
	log    *slog.Logger
	rounds map[roundID]*round
	last   map[string][]entry
}

// Bounds on what the inbox keeps, whatever arrives: at most maxRounds
// rounds, each with at most one report per other region, of at most
// maxChunks chunks of at most the transport's max payload (their keys
// decoding to at most frontcode.MaxDecoded each).
const (
	// roundsPerInterval is how many rounds of one interval start within
	// the five intervals a round is kept (round): every half interval,
	// both ends included.
	roundsPerInterval = 11
	// maxRounds holds the rounds of the two intervals this machine runs
	// (own) and as many of another: a peer's during a change of interval
	// (docs/multi-region.md, "Runtime tuning"). A round of an interval not
	// its own is refused when they are full, and evicted for one of its own.
	maxRounds = 3 * roundsPerInterval
	// maxChunks is the most chunks a report has: a coordinator whose report
	// needs more (1 GiB at the default 1 MiB payload, millions of keys)
	// sends none, and a chunk of a report of more is refused.
	maxChunks = 1024
)

// minIntervalMS is the shortest interval a coordinator runs
// (Knobs.Validate): a round of a shorter one is refused.
var minIntervalMS = policy.MinRebalanceInterval.Milliseconds()

// roundID names a round on the wire: an epoch, or with mid its
// mid-interval round.
type roundID struct {
	epoch, intervalMS int64
	mid               bool
}

// midBase is what the mid-interval round of an epoch builds on: whether
// the epoch heard every region's complete report (every region then holds
// the same reports of it, in.last) and this region's own report of it.
type midBase struct {
	epoch int64
	all   bool
	mine  []entry
}

// round is what arrived from the other regions for one epoch, and what
// this region sent in it, to send again when a region asks (Want).
type round struct {
	reports map[string]*assembly
	acks    map[string]*coordv1.Ack

	report   []*coordv1.Message // this region's report chunks
	ack      *coordv1.Message   // this region's ack
	answered map[string]answered
}

// answered is what a region's Wants of a round were answered with: each
// is sent again at most once per asking region and round, so that no
// message, duplicated or forged, costs more than one copy per region.
type answered struct{ report, ack bool }

type assembly struct {
	chunks uint32
	parts  map[uint32]chunk // the chunks arrived, until all have
	done   bool
	// entries are the report's entries in chunk order and keyed the same
	// with one entry per key, in key order; both are set once done.
	entries, keyed []entry
}

func (a *assembly) complete() bool { return a.done }

// wants reports whether chunk ch of chunks is one to file: new, in range
// and of the same count as the chunks before it.
func (a *assembly) wants(ch, chunks uint32) bool {
	_, dup := a.parts[ch]
	return !dup && !a.done && ch < a.chunks && chunks == a.chunks
}

// add files chunk ch (wanted) and, when it was the last, decodes the
// chunks in order into one array of the report's size.
func (a *assembly) add(ch uint32, c chunk) {
	a.parts[ch] = c
	if uint32(len(a.parts)) < a.chunks {
		return
	}
	n := 0
	for _, p := range a.parts {
		n += p.len()
	}
	a.entries = make([]entry, 0, n)
	for i := range a.chunks {
		a.entries = a.parts[i].appendTo(a.entries)
	}
	a.keyed, a.parts, a.done = byKey(a.entries), nil, true
}

// file stores a message in its round. A Want naming this region returns
// what to send again.
// A report chunk whose keys decode past frontcode.MaxDecoded, which no
// coordinator sends, is refused before any of it is decoded.
func (in *inbox) file(msg *coordv1.Message, now time.Time) []*coordv1.Message {
	from := msg.GetRegion()
	if rc := msg.GetReport(); rc != nil && from != in.self && slices.Contains(in.regions, from) {
		if rc.GetChunks() > maxChunks {
			in.log.Warn("coord: dropping a report chunk of too many chunks", "from", from, "chunks", rc.GetChunks(), "max", maxChunks)
			return nil
		}
		if n, ok := keyBytes(rc.GetEntries()); !ok {
			in.log.Warn("coord: dropping a report chunk whose keys decode past the bound", "from", from, "bytes", n, "bound", frontcode.MaxDecoded)
			return nil
		}
	}
	r := in.roundFrom(from, roundID{msg.GetEpoch(), msg.GetIntervalMs(), msg.GetMid()}, now)
	if r == nil {
		return nil
	}
	switch b := msg.GetBody().(type) {
	case *coordv1.Message_Report:
		rc := b.Report
		if a := r.assembly(from, rc.GetChunks()); a.wants(rc.GetChunk(), rc.GetChunks()) {
			a.add(rc.GetChunk(), protoChunk(rc.GetEntries()))
		}
	case *coordv1.Message_Ack:
		if r.acks[from] == nil { // one ack per region and epoch: a duplicate changes nothing
			r.acks[from] = b.Ack
		}
	case *coordv1.Message_Want:
		return r.answer(from, in.self, b.Want)
	}
	return nil
}

// answer returns what this region (self) sent in round r that a Want of
// region from asks for again, each at most once per region: nothing of
// what was not sent yet (it goes out when it is).
func (r *round) answer(from, self string, w *coordv1.Want) []*coordv1.Message {
	var out []*coordv1.Message
	a := r.answered[from]
	if !a.report && len(r.report) > 0 && slices.Contains(w.GetReports(), self) {
		out, a.report = append(out, r.report...), true
	}
	if !a.ack && r.ack != nil && slices.Contains(w.GetAcks(), self) {
		out, a.ack = append(out, r.ack), true
	}
	if len(out) > 0 {
		if r.answered == nil {
			r.answered = map[string]answered{}
		}
		r.answered[from] = a
	}
	return out
}

// fileWire stores a message given as it traveled in its round: a report
// chunk to file is decoded from the wire; anything else goes through
// proto.Unmarshal and file, as the transport once did for every message,
// so that what is filed, created or dropped is the same either way. It
// returns what file does.
func (in *inbox) fileWire(b []byte, now time.Time) []*coordv1.Message {
	if w, ok := readReportWire(b); ok {
		if w.region == in.self || !slices.Contains(in.regions, w.region) {
			return nil // this region's own (each comes back) or an unknown region's: ignored, whatever it holds
		}
		id := roundID{w.epoch, w.intervalMS, w.mid}
		var a *assembly
		if r := in.rounds[id]; r != nil {
			a = r.reports[w.region]
		}
		if a != nil && !a.wants(w.chunk, w.chunks) {
			return nil // nothing to file, whatever it holds
		}
		if a != nil || w.chunk < w.chunks && w.chunks <= maxChunks {
			if c, ok := w.check(); ok {
				if r := in.roundFrom(w.region, id, now); r != nil {
					r.assembly(w.region, w.chunks).add(w.chunk, c)
				}
				return nil
			}
		}
	}
	msg := &coordv1.Message{}
	if err := proto.Unmarshal(b, msg); err != nil {
		in.log.Warn("coord: dropping undecodable message", "err", err)
		return nil
	}
	return in.file(msg, now)
}

// roundFrom returns the round of a message of region from, or nil when
// the message is to be ignored: from this region (the standby's own
// reports are never needed: a new active reads its shares from Redis), of
// an unknown region, or of a round not kept.
func (in *inbox) roundFrom(from string, id roundID, now time.Time) *round {
	if from == in.self || !slices.Contains(in.regions, from) {
		return nil
	}
	return in.round(id, now)
}

// assembly returns the report of region from being assembled, starting
// one of chunks chunks.
func (r *round) assembly(from string, chunks uint32) *assembly {
	a := r.reports[from]
	if a == nil {
		a = &assembly{chunks: chunks, parts: map[uint32]chunk{}}
		r.reports[from] = a
	}
	return a
}

// round returns the round of id, creating it, or nil for a round not
// kept: one that started more than three of its intervals ago (or starts
// more than two ahead: a skewed or bogus clock), of an interval shorter
// than any coordinator runs, or beyond maxRounds. A round of an interval
// longer than this machine's is kept as long as one of this machine's
// would be: it is of use only once this machine runs that interval, and
// a forged interval cannot keep a round for ever.
func (in *inbox) round(id roundID, at time.Time) *round {
	now := at.UnixMilli()
	if in.stale(id, now) {
		return nil
	}
	for old := range in.rounds {
		if in.stale(old, now) {
			delete(in.rounds, old)
		}
	}
	r := in.rounds[id]
	if r == nil {
		if len(in.rounds) >= maxRounds && !in.evictFor(id) {
			in.log.Warn("coord: dropping a message of a round beyond the rounds kept", "interval_ms", id.intervalMS, "max", maxRounds)
			return nil
		}
		r = &round{reports: map[string]*assembly{}, acks: map[string]*coordv1.Ack{}}
		in.rounds[id] = r
	}
	return r
}

// stale reports whether round id is not to be kept at now (ms): see round.
func (in *inbox) stale(id roundID, now int64) bool {
	if id.intervalMS < minIntervalMS || id.epoch < 0 {
		return true
	}
	iv := id.intervalMS
	if longest := max(in.own[0], in.own[1]); longest > 0 {
		iv = min(iv, longest)
	}
	lo, hi := now-3*iv, now+2*iv
	if id.epoch > hi/id.intervalMS { // and epoch·intervalMS cannot overflow
		return true
	}
	start := id.epoch * id.intervalMS
	if id.mid {
		start += id.intervalMS / 2
	}
	return start < lo || start > hi
}

// evictFor makes room for round id when it is of an interval this machine
// runs, by dropping the first round (by interval, epoch, mid) of another:
// there is one, since this machine's own take at most 2·roundsPerInterval.
func (in *inbox) evictFor(id roundID) bool {
	if id.intervalMS != in.own[0] && id.intervalMS != in.own[1] {
		return false
	}
	var victim *roundID
	for old := range in.rounds {
		if old.intervalMS == in.own[0] || old.intervalMS == in.own[1] {
			continue
		}
		if victim == nil || old.before(*victim) {
			victim = &old
		}
	}
	if victim == nil {
		return false
	}
	delete(in.rounds, *victim)
	return true
}

// before orders rounds by interval, epoch and mid.
func (id roundID) before(o roundID) bool {
	if id.intervalMS != o.intervalMS {
		return id.intervalMS < o.intervalMS
	}
	if id.epoch != o.epoch {
		return id.epoch < o.epoch
	}
	return !id.mid && o.mid
}

// roundOrEmpty is round, or an empty round when this epoch runs so late
// that its messages are no longer kept: it then hears nobody, which is
// safe.
func (in *inbox) roundOrEmpty(id roundID, now time.Time) *round {
	if r := in.round(id, now); r != nil {
		return r
	}
	return &round{reports: map[string]*assembly{}, acks: map[string]*coordv1.Ack{}}
}

// heard returns the sorted names of the regions whose complete reports of
// round r arrived (self always) and remembers their shares.
func (in *inbox) heard(r *round) []string {
	out := in.completeRegions(r)
	for _, name := range out {
		if a := r.reports[name]; a != nil {
			in.last[name] = a.keyed
		}
	}
	return out
}

// completeRegions returns the sorted names of the regions whose complete
// reports of round r arrived, self always.
func (in *inbox) completeRegions(r *round) []string {
	out := []string{in.self}
	for name, a := range r.reports {
		if a.complete() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// missingReports returns the other regions whose complete report of round
// r has not arrived, sorted.
func (in *inbox) missingReports(r *round) []string {
	var out []string
	for _, name := range in.regions {
		if a := r.reports[name]; name != in.self && (a == nil || !a.complete()) {
			out = append(out, name)
		}
	}
	return out
}

// missingAcks returns the heard regions (self aside) whose ack of round r
// has not arrived, sorted as heard is.
func (in *inbox) missingAcks(r *round, heard []string) []string {
	var out []string
	for _, name := range heard {
		if name != in.self && r.acks[name] == nil {
			out = append(out, name)
		}
	}
	return out
}

// group reports whether every heard region acknowledged, successfully, a
// plan made from exactly the same heard set.
func (in *inbox) group(r *round, heard []string) bool {
	for _, name := range heard {
		if name == in.self {
			continue
		}
		a := r.acks[name]
		if a == nil || !a.GetOk() || !slices.Equal(a.GetHeard(), heard) {
			return false
		}
	}
	return true
}
