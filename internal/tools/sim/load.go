package sim

import (
	"math/rand/v2"
	"sort"
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
