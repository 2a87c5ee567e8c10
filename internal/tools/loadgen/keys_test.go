package loadgen

import (
	"math"
	"slices"
	"testing"
	"time"
)

// draws counts how often gen.choose picks each key for requests 0..n-1,
// the exact path a run takes (PCG seeded with (seed, i)).
func draws(t *testing.T, k Keys, seed uint64, n int) []int {
	t.Helper()
	s, err := newSampler(k)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := newRouter([]Target{{Region: "r"}}, nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := &gen{cfg: Config{Seed: seed}, keys: s, router: rt}
	size := max(k.Count, 1)
	got := make([]int, size)
	for i := range n {
		_, key := g.choose(int64(i), 0)
		if key < 0 || key >= size {
			t.Fatalf("request %d: key %d outside [0, %d)", i, key, size)
		}
		got[key]++
	}
	return got
}

// chiSquare is Pearson's statistic of got against probabilities p.
func chiSquare(got []int, p func(int) float64, n int) float64 {
	x := 0.0
	for i, g := range got {
		e := p(i) * float64(n)
		x += (float64(g) - e) * (float64(g) - e) / e
	}
	return x
}

// The seeds are fixed, so these tests are deterministic; the thresholds
// are the 0.1% critical values, so a correct sampler passes them for all
// but one seed in a thousand and a wrong one (say an off-by-one rank or a
// skewed unit()) fails them by orders of magnitude.

func TestUniformPicksEveryKeyEqually(t *testing.T) {
	const n, k = 200_000, 20
	got := draws(t, Keys{Dist: Uniform, Count: k}, 42, n)
	// chi-square, 19 degrees of freedom: 43.82 at p = 0.001.
	if x := chiSquare(got, func(int) float64 { return 1.0 / k }, n); x > 43.82 {
		t.Fatalf("chi-square %.1f > 43.82 (counts %v)", x, got)
	}
}

func TestZipfFollowsPowerLaw(t *testing.T) {
	const n, k = 400_000, 1000
	for _, s := range []float64{0.99, 1.1, 2} {
		keys := Keys{Dist: Zipf, Count: k, S: s}
		got := draws(t, keys, 7, n)
		// Expected P(k) = (k+1)^-s / H(K, s), computed independently of
		// the sampler's table.
		h := 0.0
		for i := range k {
			h += math.Pow(float64(i+1), -s)
		}
		p := func(i int) float64 { return math.Pow(float64(i+1), -s) / h }
		// Chi-square over ranks 0..29 plus the tail as one cell (every
		// cell expects > 5 draws): 30 degrees of freedom, 59.70 at p = 0.001.
		cells, cellP := make([]int, 31), make([]float64, 31)
		for i, g := range got {
			c := min(i, 30)
			cells[c] += g
			cellP[c] += p(i)
		}
		if x := chiSquare(cells, func(i int) float64 { return cellP[i] }, n); x > 59.70 {
			t.Errorf("s=%v: chi-square %.1f > 59.70; head %v", s, x, cells[:5])
		}
		// Key 0 is the hottest and the ratio of ranks 1 and 2 is 2^s.
		if got[0] < got[1] || got[1] < got[3] {
			t.Errorf("s=%v: ranks not decreasing: %v", s, got[:4])
		}
		ratio := float64(got[0]) / float64(got[1])
		if want := math.Pow(2, s); math.Abs(ratio-want)/want > 0.05 {
			t.Errorf("s=%v: count(0)/count(1) = %.3f, want 2^s = %.3f within 5%%", s, ratio, want)
		}
	}
}

func TestHotSendsEverythingToOneKey(t *testing.T) {
	got := draws(t, Keys{Dist: Hot}, 3, 10_000)
	if got[0] != 10_000 {
		t.Fatalf("hot key got %d of 10000", got[0])
	}
}

func TestSamplerTableMatchesDefinition(t *testing.T) {
	s, err := newSampler(Keys{Dist: Zipf, Count: 5, S: 1})
	if err != nil {
		t.Fatal(err)
	}
	h := 1 + 1.0/2 + 1.0/3 + 1.0/4 + 1.0/5
	for i := range 5 {
		if want := 1 / float64(i+1) / h; math.Abs(s.prob(i)-want) > 1e-12 {
			t.Errorf("P(%d) = %v, want %v", i, s.prob(i), want)
		}
	}
	// The extremes of u map inside the key range.
	if k := s.pick(0); k != 0 {
		t.Errorf("pick(0) = %d", k)
	}
	if k := s.pick(math.Nextafter(1, 0)); k != 4 {
		t.Errorf("pick(1-) = %d", k)
	}
}

func TestRouterSplitAndShift(t *testing.T) {
	targets := []Target{{Region: "us"}, {Region: "eu"}, {Region: "ap"}}
	rt, err := newRouter(targets,
		[]Weight{{"us", 0.33}, {"eu", 0.33}, {"ap", 0.34}}, 30*time.Second,
		[]Weight{{"us", 0.9}, {"eu", 0.05}, {"ap", 0.05}})
	if err != nil {
		t.Fatal(err)
	}
	g := &gen{cfg: Config{Seed: 11}, router: rt, keys: &sampler{dist: Hot}}
	const n = 300_000
	for _, phase := range []struct {
		at   time.Duration
		want []float64
	}{{29 * time.Second, []float64{0.33, 0.33, 0.34}}, {30 * time.Second, []float64{0.9, 0.05, 0.05}}} {
		got := make([]int, 3)
		for i := range n {
			r, _ := g.choose(int64(i), phase.at)
			got[r]++
		}
		// 2 degrees of freedom: 13.82 at p = 0.001.
		if x := chiSquare(got, func(i int) float64 { return phase.want[i] }, n); x > 13.82 {
			t.Errorf("at %v: chi-square %.1f > 13.82; counts %v, want shares %v", phase.at, x, got, phase.want)
		}
	}
}

func TestRouterRejectsBadSplits(t *testing.T) {
	targets := []Target{{Region: "us"}, {Region: "eu"}}
	for _, split := range [][]Weight{
		{{"mars", 1}},
		{{"us", -1}, {"eu", 2}},
		{{"us", 0}, {"eu", 0}},
		{{"us", 1}, {"us", 1}},
		{{"us", math.NaN()}},
	} {
		if _, err := newRouter(targets, split, 0, nil); err == nil {
			t.Errorf("split %v accepted", split)
		}
	}
	// A region the split leaves out gets nothing.
	rt, err := newRouter(targets, []Weight{{"eu", 1}}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []float64{0, 0.5, math.Nextafter(1, 0)} {
		if r := rt.pick(0, u); r != 1 {
			t.Errorf("u=%v picked %d, want eu", u, r)
		}
	}
}

func TestParseIdeal(t *testing.T) {
	for in, want := range map[string][2]int64{"100": {100, int64(time.Second)}, "60/1h": {60, int64(time.Hour)}, "5/s": {5, int64(time.Second)}, "3/2m": {3, int64(2 * time.Minute)}} {
		s, err := ParseIdeal(in, 7)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if s.Limit != want[0] || int64(s.Period) != want[1] || s.Burst != 7 {
			t.Errorf("%q: got %d/%v burst %d", in, s.Limit, s.Period, s.Burst)
		}
	}
	for _, bad := range []string{"x", "0", "-1/s", "5/banana", "1.5"} {
		if _, err := ParseIdeal(bad, 0); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseTargets(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []Target
	}{
		{"us=a:1,eu=b:1", []Target{{"us", "a:1"}, {"eu", "b:1"}}},
		{" us = a:1 , eu=b:1,us=a:2 ", []Target{{"us", "a:1"}, {"eu", "b:1"}, {"us", "a:2"}}},
		{"a:1", []Target{{"default", "a:1"}}},
		{"a:1,a:2", []Target{{"default", "a:1"}, {"default", "a:2"}}},
		{"us=http://a:1,eu=a:1", []Target{{"us", "http://a:1"}, {"eu", "a:1"}}},
	} {
		got, err := ParseTargets(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseTargets(%q) = %v, %v; want %v", c.in, got, err, c.want)
			continue
		}
		if back, err := ParseTargets(FormatTargets(got)); err != nil || !slices.Equal(back, got) {
			t.Errorf("FormatTargets(%v) = %q, which parses to %v, %v", got, FormatTargets(got), back, err)
		}
	}
	for _, bad := range []string{"", " , ", "us=", "=a:1", "us=a:1,us=a:1", "us=a:1,eu=b:1,us= a:1"} {
		if got, err := ParseTargets(bad); err == nil {
			t.Errorf("ParseTargets(%q) = %v, want an error", bad, got)
		}
	}
	got, _ := ParseTargets("us=a:1,eu=b:1,us=a:2,ap=c:1,eu=b:2")
	if regions := regionsOf(got); !slices.Equal(regions, []string{"us", "eu", "ap"}) {
		t.Errorf("regions %v, want us, eu, ap in the order first named", regions)
	}
}
