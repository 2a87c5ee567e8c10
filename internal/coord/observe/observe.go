// Package observe holds what a coordinator reports of its epochs, so that
// telemetry can record them without linking the coordinator (which every
// node would then link too).
package observe

import (
	"time"

	"github.com/allot-dev/allot/rebalance"
)

// Round describes one finished active epoch, or mid-interval round, for
// coord.Config.Observe.
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
	// Compute is the time spent encoding, decoding and planning (the
	// coordinator's own CPU work, without waiting on the network or Redis).
	Compute time.Duration
	// Rounds is how many epochs this coordinator has run while active,
	// this one included. Epoch numbers follow the wall clock and skip
	// when the process stalls; Rounds does not.
	Rounds int64
}
