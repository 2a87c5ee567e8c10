package loadgen

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Dist names how a run picks keys.
type Dist uint8

// The key distributions.
const (
	// Uniform picks each of the K keys with probability 1/K.
	Uniform Dist = iota
	// Zipf picks key k (0-based rank) with probability proportional to
	// 1/(k+1)^s, so key 0 is the hottest. Any s >= 0 is allowed (s = 0 is
	// uniform); math/rand's Zipf needs s > 1, which excludes the s ≈ 1
	// that real request logs show, hence the table below.
	Zipf
	// Hot sends every request to key 0.
	Hot
)

// String returns the flag spelling of d.
func (d Dist) String() string {
	switch d {
	case Uniform:
		return "uniform"
	case Zipf:
		return "zipf"
	case Hot:
		return "hot"
	}
	return fmt.Sprintf("Dist(%d)", d)
}

// ParseDist returns the distribution spelled s (uniform, zipf, hot).
func ParseDist(s string) (Dist, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "uniform":
		return Uniform, nil
	case "zipf":
		return Zipf, nil
	case "hot":
		return Hot, nil
	}
	return 0, fmt.Errorf("unknown key distribution %q (want uniform, zipf or hot)", s)
}

// MaxZipfKeys bounds K for Zipf: the sampler holds one float64 per key.
const MaxZipfKeys = 1 << 24

// Keys says which keys a run uses: Count keys (K) drawn by Dist, with
// Zipf's exponent S.
type Keys struct {
	Dist  Dist
	Count int     // K; ignored (1) for Hot
	S     float64 // Zipf exponent, >= 0
}

// String describes k for reports, e.g. "zipf(s=1.1) over 1000 keys".
func (k Keys) String() string {
	switch k.Dist {
	case Hot:
		return "one hot key"
	case Zipf:
		return fmt.Sprintf("zipf(s=%g) over %d keys", k.S, k.Count)
	}
	return fmt.Sprintf("uniform over %d keys", k.Count)
}

func (k Keys) validate() error {
	switch k.Dist {
	case Hot:
		return nil
	case Uniform:
		if k.Count < 1 {
			return fmt.Errorf("key count %d: want at least 1", k.Count)
		}
		return nil
	case Zipf:
		if k.Count < 1 || k.Count > MaxZipfKeys {
			return fmt.Errorf("key count %d: want 1..%d for zipf", k.Count, MaxZipfKeys)
		}
		if k.S < 0 || math.IsNaN(k.S) || math.IsInf(k.S, 0) {
			return fmt.Errorf("zipf s %v: want a finite number >= 0", k.S)
		}
		return nil
	}
	return fmt.Errorf("unknown key distribution %v", k.Dist)
}

// sampler maps a uniform number in [0, 1) to a key index. It is immutable
// once built, so workers share it without locks.
type sampler struct {
	dist  Dist
	count int
	cdf   []float64 // Zipf: cdf[k] = P(key <= k), cdf[K-1] = 1
}

func newSampler(k Keys) (*sampler, error) {
	if err := k.validate(); err != nil {
		return nil, err
	}
	s := &sampler{dist: k.Dist, count: k.Count}
	if k.Dist != Zipf {
		return s, nil
	}
	s.cdf = ZipfCDF(k.Count, k.S)
	return s, nil
}

// ZipfCDF is the cumulative distribution of n ranks under Zipf's law of
// exponent s (rank k weighs k^-s, s > 0): cdf[k] = P(rank <= k), with
// cdf[n-1] exactly 1. The simulator (internal/sim) draws from it too.
func ZipfCDF(n int, s float64) []float64 {
	cdf := make([]float64, n)
	sum := 0.0
	for i := range cdf {
		sum += math.Pow(float64(i+1), -s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[n-1] = 1 // rounding must not leave a gap above the last rank
	return cdf
}

// pick returns the key index for u in [0, 1).
func (s *sampler) pick(u float64) int {
	switch s.dist {
	case Hot:
		return 0
	case Zipf:
		// The first rank whose cumulative probability exceeds u.
		return sort.Search(len(s.cdf), func(i int) bool { return s.cdf[i] > u })
	}
	return min(int(u*float64(s.count)), s.count-1)
}

// prob is the probability of key i (for tests and docs).
func (s *sampler) prob(i int) float64 {
	switch s.dist {
	case Hot:
		if i == 0 {
			return 1
		}
		return 0
	case Zipf:
		if i == 0 {
			return s.cdf[0]
		}
		return s.cdf[i] - s.cdf[i-1]
	}
	return 1 / float64(s.count)
}
