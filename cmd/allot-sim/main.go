// Command allot-sim runs a whole Allot fleet on virtual time (package
// internal/tools/sim): the real lease managers and coordinator machines, with
// Redis, NATS and their latencies simulated. The same flags and seed
// print the same bytes. See README ("Simulating a fleet").
//
// It opens no connection and starts no process: nothing leaves it but
// its report and the files it is asked to write (--png, --cpuprofile).
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
	away := fs.String("away", "", "take each node out of its region's rotation in turn, as a load balancer draining it: for/every[@from[-to]],\n"+
		"e.g. 450ms/2s@30s: from 30s each node gets none of the region's requests for 450ms every 2s, the nodes' turns spread over\n"+
		"the 2s; its requests go to the next node in rotation (with one node per region they are held back). Traffic that comes\n"+
		"back to a node between one and two lease TTLs later finds the grant it held expired (past_ttl_admissions counts any spent)")
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
	part := fs.String("partition", "", "coordinator links cut, which@from-to,...: which is a region (all its links, both ways: 1), one link both ways (1<>2),\n"+
		"one link one way (1>2: only 1's messages to 2), or one way of all a region's links (1>*: what leaves 1; *>1: what reaches 1);\n"+
		"e.g. 1@60s-120s,0>2@30s-40s")
	fail := fs.String("failover", "", "Redis failovers losing writes, region@time:loss,... e.g. 0@90s:500ms")
	cfail := fs.String("coord-failover", "", "coordinator crashes; a new one starts takeover-delay later and takes the lock once the crashed one's expired,\n"+
		"region@time:takeover-delay,... e.g. 0@60s:10s")
	jitter := fs.String("jitter", "", "per-message latency jitter, uniform in [0, d), by link: node (node<->Redis, node demand to its coordinator),\n"+
		"coord (coordinator<->Redis), region (between regions); one d for all, or e.g. node=1ms,coord=2ms,region=30ms")
	loss := fs.String("loss", "", "message faults on the NATS transports (between regions, node demand to its coordinator): drop=p,dup=p,reorder=p,hold=d\n"+
		"(a reordered message is held back uniform [0, hold), default 100ms); a lone p drops only; e.g. drop=0.05,dup=0.02,reorder=0.1")
	skew := fs.String("skew", "", "largest clock offset, drawn per region's Redis (TIME, key expiry), per node (lease clock) and per region's coordinators\n"+
		"(epoch alignment) from [-d, d]; one d for all, or e.g. redis=200ms,node=50ms,coord=1s")
	outage := fs.String("redis-outage", "", "a region's Redis unreachable (calls fail after a round trip; data kept), region@from-to,... e.g. 1@35s-45s;\n"+
		"requests that need it are decided by --on-store-failure")
	fs.StringVar(&c.OnStoreFailure, "on-store-failure", sim.FailOpen, "every policy's on_store_failure: open, closed or local (the node's fallback, limit / live nodes);\n"+
		"open and local admissions are outside the bound and reported apart (outside_open, outside_local, max_overshoot_with_outside)")
	restart := fs.String("restart", "", "nodes that crash and come back as new processes, region/node@down-up,... e.g. 0/3@40s-55s")
	join := fs.String("join", "", "nodes that join a region later (one per item), region@time,... e.g. 2@45s,2@50s")
	overlap := fs.String("coord-overlap", "", "the region's coordinator loses its lock at from without noticing until to; a new one takes the lock,\n"+
		"and both act meanwhile, region@from-to,... e.g. 0@35s-50s")
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
	if c.Away, err = sim.ParseAway(*away); err != nil {
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
	if c.Jitter, err = sim.ParseJitter(*jitter); err != nil {
		return err
	}
	if c.Loss, err = sim.ParseLoss(*loss); err != nil {
		return err
	}
	if c.Skew, err = sim.ParseSkew(*skew); err != nil {
		return err
	}
	if c.Outages, err = sim.ParseOutages(*outage); err != nil {
		return err
	}
	if c.Restarts, err = sim.ParseRestarts(*restart); err != nil {
		return err
	}
	if c.Joins, err = sim.ParseJoins(*join); err != nil {
		return err
	}
	if c.Overlaps, err = sim.ParseOverlaps(*overlap); err != nil {
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
