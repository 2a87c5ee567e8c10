// Package ratelimitheaderstest parses the RateLimit header fields strictly,
// with an independent RFC 9651 parser (github.com/dunglas/httpsfv), so
// tests check what a client would read rather than what the writer meant.
//
// It takes only the field names from package ratelimitheaders, none of
// its code, and it reads the two structured fields alone (not the
// X-RateLimit-* ones). Only tests import it.
package ratelimitheaderstest

import (
	"fmt"
	"net/http"

	"github.com/dunglas/httpsfv"

	"github.com/allot-dev/allot/ratelimitheaders"
)

// Item is one member of a RateLimit or RateLimit-Policy List: a String
// naming a policy and its Integer parameters, in order.
type Item struct {
	Name   string
	Params map[string]int64
	Keys   []string // parameter names in field order
}

// Fields are the parsed RateLimit fields of a response.
type Fields struct {
	Policy    []Item // RateLimit-Policy
	RateLimit []Item // RateLimit
}

// Parse reads RateLimit-Policy and RateLimit from h. It fails on anything
// draft-ietf-httpapi-ratelimit-headers-11 does not allow: a non-List, an
// Item that is not a String, a parameter that is not a non-negative
// Integer, a missing q or r, a w of zero.
func Parse(h http.Header) (Fields, error) {
	var f Fields
	var err error
	if f.Policy, err = list(h, ratelimitheaders.Policy, "q"); err != nil {
		return f, err
	}
	for _, it := range f.Policy {
		if w, ok := it.Params["w"]; ok && w == 0 {
			return f, fmt.Errorf("%s: %q: w must be positive", ratelimitheaders.Policy, it.Name)
		}
	}
	f.RateLimit, err = list(h, ratelimitheaders.RateLimit, "r")
	return f, err
}

func list(h http.Header, name, required string) ([]Item, error) {
	vals := h.Values(name)
	if len(vals) == 0 {
		return nil, nil
	}
	l, err := httpsfv.UnmarshalList(vals)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", name, vals, err)
	}
	out := make([]Item, 0, len(l))
	for _, m := range l {
		it, ok := m.(httpsfv.Item)
		if !ok {
			return nil, fmt.Errorf("%s: member %v is not an Item", name, m)
		}
		s, ok := it.Value.(string)
		if !ok {
			return nil, fmt.Errorf("%s: item %v is not a String", name, it.Value)
		}
		item := Item{Name: s, Params: map[string]int64{}}
		for _, k := range it.Params.Names() {
			v, _ := it.Params.Get(k)
			n, ok := v.(int64)
			if !ok || n < 0 {
				return nil, fmt.Errorf("%s: %q: parameter %s=%v is not a non-negative Integer", name, s, k, v)
			}
			item.Params[k] = n
			item.Keys = append(item.Keys, k)
		}
		if _, ok := item.Params[required]; !ok {
			return nil, fmt.Errorf("%s: %q: missing %s", name, s, required)
		}
		out = append(out, item)
	}
	return out, nil
}
