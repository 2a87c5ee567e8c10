package sim

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// The running value is the best window's excess, exactly: against every
// window (every pair of admissions) of random admission sequences, the
// largest admissions − r·T found by brute force is the largest x.
func TestBoundCheckIsEveryWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range 200 {
		rate, burst := 50+rng.Float64()*500, 10+rng.Float64()*200
		b := newBoundCheck(1, rate, burst, time.Duration(rng.IntN(2000))*time.Millisecond)
		var at []int64
		now := int64(0)
		best := math.Inf(-1)
		for range 1 + rng.IntN(300) {
			// Bursts and gaps: from the same instant to seconds apart.
			now += int64(rng.ExpFloat64() * float64(time.Second) / rate * []float64{0, 0.5, 1, 3}[rng.IntN(4)])
			at = append(at, now)
			b.admit(0, now, 1)
			best = max(best, b.x[0])
		}
		brute := math.Inf(-1)
		for i := range at {
			for j := i; j < len(at); j++ {
				brute = max(brute, float64(j-i+1)-b.rate*float64(at[j]-at[i]))
			}
		}
		if math.Abs(brute-best) > 1e-6*brute {
			t.Fatalf("running value %v, brute force over every window %v", best, brute)
		}
		if got, want := b.worst > 0, brute > b.fixed; got != want && math.Abs(brute-b.fixed) > 1e-9 {
			t.Fatalf("violation %v, brute force says %v", got, want)
		}
	}
}
