package region_test

import (
	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// One Store serves both of its callers over the same call engine
// (Store.run): the decider's exact path (Take, Refund) and the lease
// manager (Lease, Return). decide sits above region, which must not
// import it, so the check is a test's.
var (
	_ decide.Store = (*region.Store)(nil)
	_ lease.Source = (*region.Store)(nil)
)
