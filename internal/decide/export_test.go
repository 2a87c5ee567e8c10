package decide

import (
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/policy"
)

// LeaseConfigs returns the knobs of the lease limits the leased path uses
// for policy id under the decider's current set (nil: none, or exact).
func (d *Decider) LeaseConfigs(id string) []lease.Config {
	st := d.state.Load()
	var out []lease.Config
	st.set.Each(func(pol *policy.Compiled) {
		if pol.ID != id {
			return
		}
		for _, l := range st.leased[pol] {
			out = append(out, l.Config())
		}
	})
	return out
}
