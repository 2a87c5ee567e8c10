package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// matchLinear is what Match must equal: every policy tested, file order.
func matchLinear(s *Set, r *Request, tier string) []*Compiled {
	var out []*Compiled
	for _, p := range s.policies {
		if p.matches(r, tier) {
			out = append(out, p)
		}
	}
	return out
}

// realisticFile builds n policies of the shapes a large deployment has:
// most keyed by tenant (a per-tenant limit, some with an export route),
// some by tier with route globs or exact routes, some by route alone,
// and an IP perimeter.
func realisticFile(n int, rng *rand.Rand) *File {
	tiers := []string{"free", "pro", "enterprise", "partner", "internal"}
	f := &File{DefaultTier: "free", Tenants: map[string]string{}, Costs: map[string]int64{"POST /v1/exports/*": 25, "POST /v1/transfers": 10}}
	lim := []Limit{{Name: "per_second", Algorithm: "token_bucket", Limit: 50, Period: Duration(time.Second)}}
	add := func(id string, m Match, per ...Field) {
		f.Policies = append(f.Policies, Policy{ID: id, Match: m, Per: per, Limits: lim})
	}
	add("ip-perimeter", Match{}, FieldIP)
	for i := 1; len(f.Policies) < n; i++ {
		switch k := i % 20; {
		case k < 16: // 80%: per tenant
			tenant := fmt.Sprintf("t%06d", i)
			f.Tenants[tenant] = tiers[i%len(tiers)]
			if k%4 == 0 {
				add(fmt.Sprintf("tenant-%d-exports", i), Match{Tenant: tenant, Route: "/v1/exports/*"}, FieldTenant)
			} else {
				add(fmt.Sprintf("tenant-%d", i), Match{Tenant: tenant}, FieldTenant)
			}
		case k < 18: // 10%: per tier, by route
			route := fmt.Sprintf("/v1/svc%d/*", i)
			if k == 17 {
				route = fmt.Sprintf("/v1/svc%d/items", i)
			}
			add(fmt.Sprintf("tier-%d", i), Match{Tier: tiers[i%len(tiers)], Route: route}, FieldTenant)
		default: // 10%: by route alone, globs at several depths
			route := fmt.Sprintf("/api/v%d/res%d/*", i%7, i)
			if i%3 == 0 {
				route = fmt.Sprintf("/api/v%d/*/res%d", i%7, i)
			}
			add(fmt.Sprintf("route-%d", i), Match{Route: route}, FieldClient)
		}
	}
	return f
}

// requests are checks against f: existing and unknown tenants, routes
// that hit tier, route and export policies, and ones that hit none.
func requests(f *File, n int, rng *rand.Rand) []Request {
	var tenants []string
	for t := range f.Tenants {
		tenants = append(tenants, t)
	}
	out := make([]Request, n)
	for i := range out {
		r := Request{Method: "GET", IP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), Client: fmt.Sprintf("c%d", i)}
		if len(tenants) > 0 && i%5 != 0 {
			r.Tenant = tenants[rng.IntN(len(tenants))]
		} else {
			r.Tenant = fmt.Sprintf("unknown%d", i)
		}
		j := rng.IntN(len(f.Policies) + 1)
		switch {
		case i%4 == 0:
			r.Route, r.Method = "/v1/exports/report/7", "POST"
		case j < len(f.Policies) && f.Policies[j].Match.Route != "":
			// A route some policy names, made concrete.
			route := []byte(f.Policies[j].Match.Route)
			for k := range route {
				if route[k] == '*' {
					route[k] = 'x'
				}
			}
			r.Route = string(route) + "/42"[:i%2*3]
		default:
			r.Route = "/v1/users/42"
		}
		out[i] = r
	}
	return out
}

func TestIndexedMatchEqualsLinearScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{3, 10, 100, 5000} {
		f := realisticFile(n, rng)
		s, err := Compile("bench", f)
		require.NoError(t, err)
		for _, r := range requests(f, 3000, rng) {
			tier := s.Tier(&r)
			got := s.Match(&r, tier, nil)
			want := matchLinear(s, &r, tier)
			require.Equal(t, ids(want), ids(got), "n=%d request %+v", n, r)
		}
	}
}

// BenchmarkPolicyEval is the policy cost of one check: tier, cost, match.
func BenchmarkPolicyEval(b *testing.B) {
	for _, n := range []int{10, 1_000, 100_000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) { benchEval(b, n, false) })
	}
}

// BenchmarkPolicyEvalLinear is the same work without the index, to show
// what the index saves.
func BenchmarkPolicyEvalLinear(b *testing.B) {
	for _, n := range []int{10, 1_000, 100_000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) { benchEval(b, n, true) })
	}
}

func benchEval(b *testing.B, n int, linear bool) {
	rng := rand.New(rand.NewPCG(3, 4))
	f := realisticFile(n, rng)
	s, err := Compile("bench", f)
	require.NoError(b, err)
	reqs := requests(f, 4096, rng)
	dst := make([]*Compiled, 0, 16)
	matched := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r := &reqs[i%len(reqs)]
		tier := s.Tier(r)
		_ = s.Cost(r)
		if linear {
			matched += len(matchLinear(s, r, tier))
			continue
		}
		dst = s.Match(r, tier, dst[:0])
		matched += len(dst)
	}
	b.ReportMetric(float64(matched)/float64(b.N), "matched/op")
}

// FuzzIndexedMatch: for any route patterns and any request route, the
// route index finds exactly what testing every policy finds.
func FuzzIndexedMatch(f *testing.F) {
	f.Add("/v1/*", "/a/*/c", "*x", "/v1/exports", "/v1/exports/a")
	f.Add("ab*ba", "*", "a*", "", "aba")
	f.Fuzz(func(t *testing.T, p1, p2, p3, p4, route string) {
		lim := []Limit{{Name: "s", Algorithm: "token_bucket", Limit: 1, Period: Duration(time.Second)}}
		file := &File{}
		for i, pat := range []string{p1, p2, p3, p4, p1 + "*", "*" + p2, p3 + "*" + p4, p4} {
			file.Policies = append(file.Policies, Policy{ID: fmt.Sprintf("p%d", i), Match: Match{Route: pat}, Limits: lim})
		}
		s, err := Compile("fuzz", file)
		if err != nil {
			return // patterns that do not validate (invalid UTF-8, too long)
		}
		r := Request{Route: route}
		require.Equal(t, ids(matchLinear(s, &r, "")), ids(s.Match(&r, "", nil)))
	})
}
