package main

import (
	"flag"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/internal/node"
)

// gossipFlags declares the gossip flags and returns a function that sets
// them on a node.Resilience after parsing. The rest of gossip is derived
// (the advertised address and node name) or fixed (the floor of N, the
// probe interval and suspicion multiplier): ARCHITECTURE.md, "Fixed
// settings".
func gossipFlags(fs *flag.FlagSet) func(*node.Resilience) {
	addr := fs.String("gossip-addr", "", "memberlist gossip listen address HOST:PORT (TCP and UDP), also the address advertised to other nodes (a private address of this host when it binds 0.0.0.0); empty disables gossip and the local fallback divides limits by 2")
	seeds := fs.String("gossip-seeds", "", "comma-separated gossip addresses of other nodes of the region (N for the limit/N fallback)")
	return func(r *node.Resilience) {
		r.GossipAddr = *addr
		r.GossipSeeds = cli.List(*seeds)
	}
}
