package policy

import (
	"sort"
	"strings"
)

// glob is a pattern where * matches any run of characters, / included,
// and everything else matches itself.
type glob string

func (g glob) match(s string) bool {
	parts := strings.Split(string(g), "*")
	if len(parts) == 1 {
		return s == string(g)
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return strings.HasSuffix(s, last)
}

// costTable resolves a request's route cost: an exact "METHOD /path",
// then an exact "/path", then the globs, most specific (longest) first.
type costTable struct {
	exact map[string]int64 // key: "METHOD /path" or " /path"
	globs []costGlob
}

type costGlob struct {
	method string
	path   glob
	cost   int64
}

func compileCosts(m map[string]int64) costTable {
	t := costTable{exact: map[string]int64{}}
	for pattern, cost := range m {
		method, path, err := parseCostPattern(pattern)
		if err != nil {
			continue // validated before
		}
		if strings.Contains(path, "*") {
			t.globs = append(t.globs, costGlob{method, glob(path), cost})
			continue
		}
		t.exact[method+" "+path] = cost
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
		if c, ok := t.exact[method+" "+route]; ok && method != "" {
			return c
		}
		if c, ok := t.exact[" "+route]; ok {
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
