package lease

import (
	"context"
	"time"

	"github.com/allot-dev/allot/algorithm"
)

// The lease protocol: what the manager asks of the region's buckets and
// what it gets back. It is lease's own, so that the manager needs no
// Redis client to be built or tested; *region.Store serves it (lease.lua
// and return.lua), the tests' fake serves it from memory.

// Source is where leases come from and go back to: *region.Store.
type Source interface {
	// Lease asks for every group at once; groups fail independently, each
	// reply carrying its own error. The returned error is for arguments
	// the caller got wrong; nothing was asked then.
	Lease(ctx context.Context, groups []Group) ([]Reply, error)
	// Return gives back unspent tokens and reports the whole tokens the
	// buckets were credited.
	Return(ctx context.Context, items []ReturnItem) (int64, error)
}

// Item asks one bucket for tokens to spend in memory.
type Item struct {
	Key  string
	Spec algorithm.Spec
	// Need is what must be granted for the group to succeed (the cost of
	// a waiting request); 0 takes whatever the bucket has, up to Want.
	Need int64
	// Want is the grant size asked for; it must be >= Need.
	Want int64
}

// Group is the items of one subject: one script call, all-or-nothing
// on every item's Need.
type Group []Item

// ItemReply is what the source (lease.lua) answered for one item: the
// tokens granted and the region bucket's numbers.
type ItemReply struct {
	Granted int64
	// Left is the whole tokens left in the region bucket after the grant.
	Left int64
	// RetryAfter is 0 if the item's Need could be granted now,
	// algorithm.Never if it never can (Need > Burst), else how long until
	// it could.
	RetryAfter time.Duration
	// Burst and Rate (tokens/s) are the bucket's effective numbers: the
	// policy's, or the region share a coordinator wrote into the hash.
	Burst int64
	Rate  float64
	// Shared is set while RLQS clients hold parts of the bucket: their use
	// is charged after the fact, so the tokens a node finds do not show
	// it, and the node never counts itself alone on the bucket (Alone).
	Shared bool
}

// Reply answers one Group. Err is set when the call failed (the grants
// are then unknown; a call whose reply was lost may have granted).
type Reply struct {
	Granted bool
	Items   []ItemReply
	Err     error
}

// ReturnItem gives back tokens a lease did not spend.
type ReturnItem struct {
	Key     string
	Spec    algorithm.Spec
	Unspent int64
	// Age is how long ago the lease holding them was asked for, measured
	// from before the lease call was sent (never shorter than the truth).
	Age time.Duration
}
