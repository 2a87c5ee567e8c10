package policy

import (
	"sort"
	"strings"
)

// glob is a pattern where * matches any run of characters, / included,
// and everything else matches itself.
type glob string

func (g glob) match(s string) bool {
	// Walks the pattern in place rather than splitting it: this runs for
	// every candidate policy of every check and must not allocate.
	p := string(g)
	i := strings.IndexByte(p, '*')
	if i < 0 {
		return s == p
	}
	if !strings.HasPrefix(s, p[:i]) {
		return false
	}
	s, p = s[i:], p[i+1:]
	for {
		j := strings.IndexByte(p, '*')
		if j < 0 {
			return strings.HasSuffix(s, p)
		}
		k := strings.Index(s, p[:j])
		if k < 0 {
			return false
		}
		s, p = s[k+j:], p[j+1:]
	}
}

// costTable resolves a request's route cost: an exact "METHOD /path",
// then an exact "/path", then the globs, most specific (longest) first.
type costTable struct {
	exact map[costKey]int64 // method "" for any method

	globs []costGlob
}

// costKey is a struct, not "METHOD /path", so a lookup builds no string.
type costKey struct{ method, path string }

type costGlob struct {
	method string
	path   glob
	cost   int64
}

func compileCosts(m map[string]int64) costTable {
	t := costTable{exact: map[costKey]int64{}}
	for pattern, cost := range m {
		method, path, err := parseCostPattern(pattern)
		if err != nil {
			continue // validated before
		}
		if strings.Contains(path, "*") {
			t.globs = append(t.globs, costGlob{method, glob(path), cost})
			continue
		}
		t.exact[costKey{method, path}] = cost
	}
	// Map order is random; sort so the same file always resolves the same way.
	sort.Slice(t.globs, func(i, j int) bool {
		a, b := t.globs[i], t.globs[j]
		if len(a.path) != len(b.path) {
			return len(a.path) > len(b.path)
		}
		if a.method != b.method {
			return a.method > b.method // a method-specific glob before the any-method one
		}
		return a.path < b.path
	})
	return t
}

func (t *costTable) lookup(method, route string) int64 {
	if len(t.exact) > 0 {
		if c, ok := t.exact[costKey{method, route}]; ok && method != "" {
			return c
		}
		if c, ok := t.exact[costKey{"", route}]; ok {
			return c
		}
	}
	for _, g := range t.globs {
		if (g.method == "" || g.method == method) && g.path.match(route) {
			return g.cost
		}
	}
	return 1
}
