package policy

import (
	"slices"
	"strings"
)

// routeIndexMin is the length from which a candidate list gets a route
// index: below it, testing each policy is as cheap as the index lookups.
const routeIndexMin = 8

// candidates are the policies filed under one index key (a tenant, a
// client, a tier, or none), in file order. A long list is indexed by route
// as well, so that a lookup tests only the policies whose route can match:
// a set with thousands of route policies per tier (or without any exact
// matcher) still tests a handful per check.
type candidates struct {
	list   []int
	routes *routeIndex // nil: test every policy in list
}

// routeIndex files policies by their route pattern:
//
//   - exact: a route without *, looked up by the request's route;
//   - prefixes: the literal text before the first *, looked up by every
//     prefix of the request's route whose length some pattern has (plens);
//   - suffixes: the literal text after the last *, likewise (slens); a
//     pattern is filed under its prefix or its suffix, whichever fewer
//     patterns share ("/api/v1/*/orders" under "/orders", since every
//     "/api/v1/*/..." pattern shares its prefix);
//   - anyRoute: no route, or "*" alone, always tested.
//
// A lookup costs one map probe per distinct length, not one test per
// policy; the glob itself is still tested on what the probes find.
type routeIndex struct {
	exact    map[string][]int
	prefixes map[string][]int
	suffixes map[string][]int
	plens    []int // distinct prefix lengths, ascending
	slens    []int // distinct suffix lengths, ascending
	anyRoute []int
}

// affixes returns a wildcard pattern's literal prefix and suffix.
func affixes(g glob) (prefix, suffix string) {
	s := string(g)
	return s[:strings.IndexByte(s, '*')], s[strings.LastIndexByte(s, '*')+1:]
}

// index builds the route index of a long list.
func (c *candidates) index(policies []*Compiled) {
	if c == nil || len(c.list) < routeIndexMin {
		return
	}
	ri := &routeIndex{exact: map[string][]int{}, prefixes: map[string][]int{}, suffixes: map[string][]int{}}
	// Count how many patterns share each prefix and each suffix first, to
	// file each pattern under its more selective side.
	pcount, scount := map[string]int{}, map[string]int{}
	for _, i := range c.list {
		if g := policies[i].route; strings.Contains(string(g), "*") {
			p, s := affixes(g)
			pcount[p]++
			scount[s]++
		}
	}
	for _, i := range c.list {
		g := policies[i].route
		if !strings.Contains(string(g), "*") {
			if g == "" {
				ri.anyRoute = append(ri.anyRoute, i)
			} else {
				ri.exact[string(g)] = append(ri.exact[string(g)], i)
			}
			continue
		}
		p, s := affixes(g)
		switch {
		case p == "" && s == "":
			ri.anyRoute = append(ri.anyRoute, i)
		case p != "" && (s == "" || pcount[p] <= scount[s]):
			ri.prefixes[p] = append(ri.prefixes[p], i)
			ri.plens = append(ri.plens, len(p))
		default:
			ri.suffixes[s] = append(ri.suffixes[s], i)
			ri.slens = append(ri.slens, len(s))
		}
	}
	slices.Sort(ri.plens)
	ri.plens = slices.Compact(ri.plens)
	slices.Sort(ri.slens)
	ri.slens = slices.Compact(ri.slens)
	c.routes = ri
}

// match appends to dst the policies of c that match r. Order is restored
// by the caller.
func (c *candidates) match(policies []*Compiled, r *Request, tier string, dst []*Compiled) []*Compiled {
	if c == nil {
		return dst
	}
	if c.routes == nil {
		return testAll(policies, c.list, r, tier, dst)
	}
	ri := c.routes
	dst = testAll(policies, ri.anyRoute, r, tier, dst)
	dst = testAll(policies, ri.exact[r.Route], r, tier, dst)
	route := r.Route
	for _, n := range ri.plens {
		if n > len(route) {
			break
		}
		dst = testAll(policies, ri.prefixes[route[:n]], r, tier, dst)
	}
	for _, n := range ri.slens {
		if n > len(route) {
			break
		}
		dst = testAll(policies, ri.suffixes[route[len(route)-n:]], r, tier, dst)
	}
	return dst
}

func testAll(policies []*Compiled, list []int, r *Request, tier string, dst []*Compiled) []*Compiled {
	for _, i := range list {
		if p := policies[i]; p.matches(r, tier) {
			dst = append(dst, p)
		}
	}
	return dst
}
