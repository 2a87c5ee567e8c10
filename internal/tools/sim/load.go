package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/allot-dev/allot/internal/tools/loadgen"
)

// keyDist draws a key index for each request: 0 is the hottest key.
type keyDist struct {
	n   int
	cdf []float64 // zipf: cumulative weights, last = 1
	hot float64   // "hot": probability of key 0
}

func newKeyDist(c *Config) *keyDist {
	d := &keyDist{n: c.Keys}
	switch c.Dist {
	case "zipf":
		// A table, not rand.Zipf: that one wants s > 1, and the issue's
		// skews start at 1.
		d.cdf = loadgen.ZipfCDF(c.Keys, c.ZipfS)
	case "hot":
		d.hot = c.HotFrac
	}
	return d
}

func (d *keyDist) pick(rng *rand.Rand) int {
	switch {
	case d.cdf != nil:
		return min(sort.SearchFloat64s(d.cdf, rng.Float64()), d.n-1)
	case d.hot > 0:
		if d.n == 1 || rng.Float64() < d.hot {
			return 0
		}
		return 1 + rng.IntN(d.n-1)
	}
	return rng.IntN(d.n)
}

// weight is the probability of key k (for the offered rate of tracked keys).
func (d *keyDist) weight(k int) float64 {
	switch {
	case d.cdf != nil:
		if k == 0 {
			return d.cdf[0]
		}
		return d.cdf[k] - d.cdf[k-1]
	case d.hot > 0:
		if d.n == 1 {
			return 1
		}
		if k == 0 {
			return d.hot
		}
		return (1 - d.hot) / float64(d.n-1)
	}
	return 1 / float64(d.n)
}

// rates returns every region's offered requests/s at t.
func (c *Config) rates(t time.Duration, out []float64) []float64 {
	out = out[:0]
	w := weights(c.Split, c.Regions)
	if c.ShiftAt > 0 && t >= c.ShiftAt {
		to := weights(c.ShiftTo, c.Regions)
		f := 1.0
		if c.Ramp > 0 && t < c.ShiftAt+c.Ramp {
			f = float64(t-c.ShiftAt) / float64(c.Ramp)
		}
		for i := range w {
			w[i] = (1-f)*w[i] + f*to[i]
		}
	}
	for _, x := range w {
		out = append(out, c.Rate*x)
	}
	if c.FlashFor > 0 && t >= c.FlashAt && t < c.FlashAt+c.FlashFor {
		out[c.FlashRegion] *= c.FlashX
	}
	return out
}

// weights normalises ws to sum 1 (nil: even).
func weights(ws []float64, n int) []float64 {
	out := make([]float64, n)
	sum := 0.0
	for i := range out {
		out[i] = 1
		if ws != nil {
			out[i] = ws[i]
		}
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// lastChange is when the offered rates last change (the end of the last
// shift, ramp or flash crowd), 0 if never.
func (c *Config) lastChange() time.Duration {
	var t time.Duration
	if c.ShiftAt > 0 {
		t = c.ShiftAt + c.Ramp
	}
	if c.FlashFor > 0 {
		t = max(t, c.FlashAt+c.FlashFor)
	}
	return t
}

// Away takes each node out of its region's rotation in turn, as a load
// balancer draining it for a moment (a failed health check, a deploy)
// does: during [From, To) (To 0: the end of the run) node i of a region
// gets none of the region's requests for For, once every Every, its
// turns Every·i/Nodes apart; its requests go to the next node of the
// region (in the order they joined) that is alive and not away, and with
// none (one node per region) the region's clients hold them back (they
// are not offered). A node that is away keeps what it leased: when its
// traffic comes back between TTL and 2·TTL later, a grant it still holds
// is past its TTL (TestMutantsAreCaught's leases spent for twice their
// TTL).
type Away struct {
	For, Every time.Duration
	From, To   time.Duration
}

// away reports whether node i of its region is out of rotation at t.
func (a *Away) away(i, nodes int, t time.Duration) bool {
	if a.For <= 0 || t < a.From || a.To > 0 && t >= a.To {
		return false
	}
	turn := a.Every * time.Duration(i%nodes) / time.Duration(nodes)
	since := t - a.From - turn
	return since >= 0 && since%a.Every < a.For
}

// ParseAway reads "for/every[@from-to]", e.g. "450ms/3s" or
// "450ms/3s@30s-60s"; "" is none.
func ParseAway(s string) (Away, error) {
	var a Away
	if s == "" {
		return a, nil
	}
	bad := fmt.Errorf("away %q: want for/every[@from[-to]], e.g. 450ms/3s@30s-60s", s)
	spec, when, timed := strings.Cut(s, "@")
	f, e, ok := strings.Cut(spec, "/")
	if !ok {
		return a, bad
	}
	var err error
	if a.For, err = time.ParseDuration(f); err != nil {
		return a, errors.Join(bad, err)
	}
	if a.Every, err = time.ParseDuration(e); err != nil {
		return a, errors.Join(bad, err)
	}
	if timed {
		from, to, ranged := strings.Cut(when, "-")
		if a.From, err = time.ParseDuration(from); err != nil {
			return a, errors.Join(bad, err)
		}
		if ranged {
			if a.To, err = time.ParseDuration(to); err != nil {
				return a, errors.Join(bad, err)
			}
		}
	}
	return a, nil
}
