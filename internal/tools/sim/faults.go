package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The faults of issue 44, point 3, as a Config holds them and as the
// flags spell them. Every random draw they make comes from the run's
// fault RNG (Sim.frng), apart from the arrivals' RNG, so that turning a
// fault on does not change which requests arrive.

// Jitter is the extra one-way latency of each message on a kind of link,
// drawn uniformly from [0, value) per message: node <-> Redis (lease
// calls, exact checks; also the node's demand to its coordinator, on the
// region's NATS), coordinator <-> Redis (share reads and writes), region
// <-> region (coordinator messages). Jitter reorders messages too.
type Jitter struct {
	Node, Coord, Region time.Duration
}

// Loss is what the message transports do wrong: each message (between
// regions, and a node's demand to its coordinator) is dropped with
// probability Drop, else delivered twice with probability Dup, and held
// back by an extra uniform [0, Hold) with probability Reorder, so that
// later messages overtake it.
type Loss struct {
	Drop, Dup, Reorder float64
	Hold               time.Duration
}

// Skew is the largest clock offset of each kind: every region's Redis
// (its TIME, and the clock its keys expire by), every node (its
// lease.Clock and its local fallback's clock) and every region's
// coordinators (the wall clock their epochs are aligned on) is offset by
// a constant drawn uniformly from [-value, value].
type Skew struct {
	Redis, Node, Coord time.Duration
}

// Outage makes Region's Redis unreachable during [From, To): every call
// to it (lease, exact check, share read or write, the coordinator's lock)
// fails a round trip after it is sent, as a refused connection does. Its
// data is intact when it returns. Nodes decide by the policy's
// on_store_failure (Config.OnStoreFailure).
type Outage struct {
	Region   int
	From, To time.Duration
}

// Restart crashes a node at At, as Crash does, and starts it again, with
// an empty lease manager (a new process), at Back.
type Restart struct {
	Region, Node int
	At, Back     time.Duration
}

// Join adds a node to Region at At: it takes its part of the region's
// traffic from then on.
type Join struct {
	Region int
	At     time.Duration
}

// Overlap makes Region's coordinators lose the lock at From without
// noticing until To (a holder stalled past the lock's TTL, a clock
// jump): the lock's key is gone, and their renewals answer that they
// hold it whatever the key holds (unless Redis is down: then they fail,
// as every call). A new coordinator starts at From and
// takes the free lock at its first Hold; until To both act: drain
// demand, report, hear the others, write shares. At To the old ones'
// next Hold finds the new one holding the lock and they stand by.
type Overlap struct {
	Region   int
	From, To time.Duration
}

// on_store_failure modes, as policies spell them.
const (
	FailOpen   = "open"
	FailClosed = "closed"
	FailLocal  = "local"
)

// ParseJitter reads "5ms" (every link) or "node=1ms,coord=2ms,region=20ms".
func ParseJitter(s string) (Jitter, error) {
	d, err := durations(s, "node", "coord", "region")
	if err != nil {
		return Jitter{}, fmt.Errorf("jitter: %w", err)
	}
	return Jitter{Node: d[0], Coord: d[1], Region: d[2]}, nil
}

// ParseLoss reads "0.05" (drop only) or
// "drop=0.05,dup=0.02,reorder=0.1,hold=100ms".
func ParseLoss(s string) (Loss, error) {
	l := Loss{Hold: 100 * time.Millisecond}
	err := eachSetting(s, "drop,dup,reorder,hold", func(name string, v string) error {
		if name == "hold" {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("loss hold %q: %w", v, err)
			}
			l.Hold = d
			return nil
		}
		p, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("loss %q: %w", v, err)
		}
		switch name {
		case "", "drop":
			l.Drop = p
		case "dup":
			l.Dup = p
		case "reorder":
			l.Reorder = p
		}
		return nil
	})
	return l, err
}

// ParseSkew reads "50ms" (every clock) or "redis=50ms,node=20ms,coord=1s".
func ParseSkew(s string) (Skew, error) {
	d, err := durations(s, "redis", "node", "coord")
	if err != nil {
		return Skew{}, fmt.Errorf("skew: %w", err)
	}
	return Skew{Redis: d[0], Node: d[1], Coord: d[2]}, nil
}

// ParseOutages reads "region@from-to,...", e.g. "1@40s-50s".
func ParseOutages(s string) ([]Outage, error) {
	var out []Outage
	return out, eachFault(s, func(where string, from time.Duration, rest string) error {
		r, err := strconv.Atoi(where)
		if err != nil || rest == "" {
			return fmt.Errorf("redis outage %q: want region@from-to", where)
		}
		to, err := time.ParseDuration(rest)
		if err != nil {
			return fmt.Errorf("redis outage end %q: %w", rest, err)
		}
		out = append(out, Outage{Region: r, From: from, To: to})
		return nil
	})
}

// ParseRestarts reads "region/node@down-up,...", e.g. "0/3@60s-75s".
func ParseRestarts(s string) ([]Restart, error) {
	var out []Restart
	return out, eachFault(s, func(where string, at time.Duration, rest string) error {
		var r Restart
		if _, err := fmt.Sscanf(where, "%d/%d", &r.Region, &r.Node); err != nil || rest == "" {
			return fmt.Errorf("restart %q: want region/node@down-up", where)
		}
		back, err := time.ParseDuration(rest)
		if err != nil {
			return fmt.Errorf("restart time %q: %w", rest, err)
		}
		r.At, r.Back = at, back
		out = append(out, r)
		return nil
	})
}

// ParseJoins reads "region@t,...", e.g. "2@45s" (one node each).
func ParseJoins(s string) ([]Join, error) {
	var out []Join
	return out, eachFault(s, func(where string, at time.Duration, rest string) error {
		r, err := strconv.Atoi(where)
		if err != nil || rest != "" {
			return fmt.Errorf("join %q: want region@time", where)
		}
		out = append(out, Join{Region: r, At: at})
		return nil
	})
}

// ParseOverlaps reads "region@from-to,...", e.g. "0@35s-50s".
func ParseOverlaps(s string) ([]Overlap, error) {
	os, err := ParseOutages(s)
	if err != nil {
		return nil, fmt.Errorf("coordinator overlap: %w", err)
	}
	var out []Overlap
	for _, o := range os {
		out = append(out, Overlap(o))
	}
	return out, nil
}

// durations reads "name=d,..." for the names given, one duration each; a
// lone "d" sets them all.
func durations(s string, names ...string) ([]time.Duration, error) {
	out := make([]time.Duration, len(names))
	return out, eachSetting(s, strings.Join(names, ","), func(name, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%q: %w", v, err)
		}
		for i, n := range names {
			if name == "" || name == n {
				out[i] = d
			}
		}
		return nil
	})
}

// eachSetting splits "name=value,..." over the names listed (comma
// separated); a lone value without a name is passed with name "".
func eachSetting(s, names string, fn func(name, value string) error) error {
	for _, f := range splitList(s) {
		name, v, ok := strings.Cut(f, "=")
		if !ok {
			name, v = "", f
		} else if !strings.Contains(","+names+",", ","+name+",") {
			return fmt.Errorf("setting %q: want one of %s", name, names)
		}
		if err := fn(name, v); err != nil {
			return err
		}
	}
	return nil
}
