package coord

import (
	"time"

	coordv1 "github.com/allot-dev/allot/proto/coord/v1"
	"github.com/allot-dev/allot/rebalance"
)

// What a Machine and its driver say to each other: the Ready it asks the
// driver to carry out, and the Inputs Step takes back.

// Ready is what a Machine asks its driver to do, in this order: publish
// Messages (best effort, no result), then for each request Step its result
// back: Drain -> Drained, Hold -> LockHeld, ReadCounts -> Counted,
// ReadShares -> SharesRead, WriteQuotas -> QuotasWritten, WriteShares ->
// SharesWritten. Round, when set, is a finished active epoch to observe.
type Ready struct {
	Messages []*coordv1.Message
	// Drain asks for the region's demand since the previous Drain.
	Drain bool
	// Hold asks to acquire or renew the region's lock.
	Hold bool
	// ReadCounts lists global quota keys whose counts to read.
	ReadCounts []string
	// ReadShares asks for the shares in force of ShareKeys (a new active
	// coordinator's takeover).
	ReadShares bool
	ShareKeys  []string
	// WriteQuotas are remote counts to store.
	WriteQuotas []RemoteCount
	// WriteShares are share updates to apply (phase 1 or phase 2).
	WriteShares []ShareUpdate
	// Round is set when an active epoch finished; its End and
	// Stats.Compute are the driver's to fill (the machine has no clock).
	Round *Round
}

// Empty reports whether rd asks for nothing.
func (rd *Ready) Empty() bool {
	return len(rd.Messages) == 0 && !rd.Drain && !rd.Hold && rd.ReadCounts == nil && !rd.ReadShares &&
		len(rd.WriteQuotas) == 0 && len(rd.WriteShares) == 0 && rd.Round == nil
}

// Input is what Step takes: Received, or the result of a Ready request.
type Input interface{ input() }

// Received is a message from another region (or this region's own, which
// is ignored) as it traveled. A report chunk is decoded straight into the
// machine's entries, without a decoded message's allocation per entry (a
// report of a million keys is a million entries per region and epoch).
type Received struct{ Wire []byte }

// Drained is the region's demand since the previous Drain: tokens
// (admitted plus denied) per key.
type Drained struct{ Tokens map[string]float64 }

// LockHeld is the result of Hold.
type LockHeld struct {
	Held bool
	Err  error
}

// Counted is the result of ReadCounts.
type Counted struct {
	Counts map[string]QuotaCount
	Err    error
}

// SharesRead is the result of ReadShares.
type SharesRead struct {
	Shares map[string]rebalance.Share
	Err    error
}

// SharesWritten is the result of WriteShares.
type SharesWritten struct{ Err error }

// QuotasWritten is the result of WriteQuotas.
type QuotasWritten struct{ Err error }

func (Received) input()      {}
func (Drained) input()       {}
func (LockHeld) input()      {}
func (Counted) input()       {}
func (SharesRead) input()    {}
func (SharesWritten) input() {}
func (QuotasWritten) input() {}

// Round describes one finished active epoch, or mid-interval round, for
// Config.Observe (and telemetry).
type Round struct {
	Start, End time.Time // wall clock of the epoch's work
	Stats      Stats
	// Regions is how many regions share the global limits; Shares holds
	// this region's shares in force that differ from the default 1/Regions
	// (parts of rebalance.Unit), in no particular order and without keys,
	// so that observers can only aggregate them.
	Regions int
	Shares  []rebalance.Share
}

// Stats describe the last epoch this coordinator ran as the active one,
// or with Mid that epoch's mid-interval round.
type Stats struct {
	Epoch int64
	// Mid marks the epoch's mid-interval round (docs/multi-region.md,
	// "Mid-interval rounds"): Keys are the keys any region reported moved,
	// and Rounds and the shares in force are left out.
	Mid bool
	// Heard is how many regions' complete reports were used (self too).
	Heard int
	// Group says every heard region acknowledged the same view, so
	// shares could grow.
	Group bool
	// Keys is how many keys were planned; Reported how many this region
	// reported; Written how many shares were written to Redis (changes
	// and refreshes of shares that are not the default).
	Keys, Reported, Written int
	// Quotas is how many global quota counts this region reported.
	Quotas int
	// ReportBytes and Chunks measure this region's report.
	ReportBytes, Chunks int
	// Asked is how many of the round's gathers asked the other regions
	// for a report or an ack that had not arrived by half the phase.
	Asked int
	// Compute is the time spent encoding, decoding and planning (the
	// coordinator's own CPU work, without waiting on the network or Redis).
	Compute time.Duration
	// Rounds is how many epochs this coordinator has run while active,
	// this one included. Epoch numbers follow the wall clock and skip
	// when the process stalls; Rounds does not.
	Rounds int64
}
