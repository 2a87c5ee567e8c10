package main

import (
	"flag"

	"github.com/allot-dev/allot/cmd/internal/cli"
	"github.com/allot-dev/allot/internal/node"
)

// multiRegionFlags declares the flags of node.MultiRegion and returns a
// function that reads them after parsing. --region, --regions and --nats
// mean what they mean for allot-coordinator. Demand is published every
// second (node.MultiRegion's default; ARCHITECTURE.md, "Fixed settings").
func multiRegionFlags(fs *flag.FlagSet) func() node.MultiRegion {
	region := fs.String("region", "", "multi-region: this node's region; empty: global limits are enforced whole, as regional ones")
	regions := fs.String("regions", "", "multi-region: every region's name, comma-separated (this one included); a global limit enforces L/n here until the coordinator writes a share")
	natsURL := fs.String("nats", "", "multi-region: NATS URL of this region's cluster (nats://[USER:PASSWORD@]HOST:PORT, tls:// for TLS); the node publishes per-key demand there for the coordinator every second")
	return func() node.MultiRegion {
		return node.MultiRegion{Region: *region, Regions: cli.List(*regions), NATSURL: *natsURL}
	}
}
