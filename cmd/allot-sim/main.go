// Command allot-sim runs a whole Allot fleet on virtual time (package
// internal/tools/sim): the real lease managers and coordinator machines, with
// Redis, NATS and their latencies simulated. The same flags and seed
// print the same bytes. See README ("Simulating a fleet").
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime/debug"
	"runtime/pprof"

	"github.com/allot-dev/allot/internal/tools/sim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "allot-sim:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	c := sim.Default()
	fs := flag.NewFlagSet("allot-sim", flag.ContinueOnError)
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (arrivals, keys, nodes)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "virtual time simulated")
	fs.IntVar(&c.Regions, "regions", c.Regions, "regions")
	fs.IntVar(&c.Nodes, "nodes", c.Nodes, "nodes per region")
	fs.BoolVar(&c.HotNode, "hot-node", c.HotNode, "send each region's traffic to its node 0 only")
	fs.IntVar(&c.Keys, "keys", c.Keys, "keys (every one a global limit)")
	fs.StringVar(&c.Dist, "dist", c.Dist, "key distribution: uniform, zipf or hot")
	fs.Float64Var(&c.ZipfS, "zipf-s", c.ZipfS, "zipf exponent")
	fs.Float64Var(&c.HotFrac, "hot-frac", c.HotFrac, "dist hot: the part of requests for key 0")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "offered requests/s, all regions")
	split := fs.String("split", "", "offered weights per region before the shift, e.g. 1,1,1 (default even)")
	fs.DurationVar(&c.ShiftAt, "shift-at", c.ShiftAt, "when the split shifts (0: never)")
	shiftTo := fs.String("shift-to", "", "weights per region after the shift, e.g. 0.9,0.05,0.05")
	fs.DurationVar(&c.Ramp, "ramp", c.Ramp, "the shift is a linear ramp this long (0: a step)")
	fs.IntVar(&c.FlashRegion, "flash-region", c.FlashRegion, "flash crowd: the region whose rate jumps")
	fs.DurationVar(&c.FlashAt, "flash-at", c.FlashAt, "flash crowd: when it starts")
	fs.DurationVar(&c.FlashFor, "flash-for", c.FlashFor, "flash crowd: how long it lasts (0: none)")
	fs.Float64Var(&c.FlashX, "flash-x", 10, "flash crowd: the factor on the region's rate")
	fs.Int64Var(&c.Limit, "limit", c.Limit, "every key's global limit, tokens/s")
	fs.Int64Var(&c.Burst, "burst", c.Burst, "every key's global burst (0: limit)")
	fs.DurationVar(&c.TTL, "ttl", c.TTL, "lease TTL")
	fs.DurationVar(&c.TargetPeriod, "target-period", c.TargetPeriod, "lease target period")
	fs.IntVar(&c.ColdHits, "cold-hits", c.ColdHits, "lease cold hits: Takes per half TTL that make a key lease (0: the default)")
	fs.DurationVar(&c.Interval, "interval", c.Interval, "rebalance interval")
	fs.Float64Var(&c.Headroom, "headroom", c.Headroom, "rebalance headroom")
	fs.Float64Var(&c.Gather, "gather", c.Gather, "rebalance gather fraction of the interval")
	fs.DurationVar(&c.DemandPeriod, "demand-period", c.DemandPeriod, "how often nodes publish demand")
	fs.DurationVar(&c.RedisRTT, "redis-rtt", c.RedisRTT, "node/coordinator to region Redis round trip")
	fs.DurationVar(&c.RegionLatency, "region-latency", c.RegionLatency, "one-way latency between regions")
	fs.DurationVar(&c.Arrival, "arrival-tick", c.Arrival, "arrivals are generated on this tick")
	fs.DurationVar(&c.Phase, "phase", c.Phase, "the run starts this far past an epoch boundary")
	crash := fs.String("crash", "", "node crashes, region/node@time,... e.g. 0/3@2m")
	part := fs.String("partition", "", "region partitions, region@from-to,... e.g. 1@60s-120s")
	fail := fs.String("failover", "", "Redis failovers losing writes, region@time:loss,... e.g. 0@90s:500ms")
	cfail := fs.String("coord-failover", "", "coordinator crashes, region@time:takeover-delay,... e.g. 0@60s:10s")
	png := fs.String("png", "", "write a plot of the hottest key's admitted vs ideal to this file")
	prof := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if c.Split, err = sim.ParseWeights(*split); err != nil {
		return err
	}
	if c.ShiftTo, err = sim.ParseWeights(*shiftTo); err != nil {
		return err
	}
	if c.Crashes, err = sim.ParseCrashes(*crash); err != nil {
		return err
	}
	if c.Partitions, err = sim.ParsePartitions(*part); err != nil {
		return err
	}
	if c.Failovers, err = sim.ParseFailovers(*fail); err != nil {
		return err
	}
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if c.CoordFailovers, err = sim.ParseCoordFailovers(*cfail); err != nil {
		return err
	}
	// The run allocates small short-lived events by the million and keeps
	// little: fewer collections for more memory.
	debug.SetGCPercent(400)
	// The scripts' interpreter makes garbage by the gigabyte, and the
	// GC's 400 % would let the heap grow to five times what is live: a
	// soft limit keeps the 10^6-key runs within 8 GB (issue 44), unless
	// GOMEMLIMIT says otherwise.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(6 << 30)
	}
	res, err := sim.Run(c)
	if err != nil {
		return err
	}
	if *png != "" {
		if err := res.WritePNG(*png); err != nil {
			return err
		}
	}
	return res.Write(os.Stdout)
}
