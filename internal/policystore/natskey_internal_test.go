package policystore

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/policy"
)

// FuzzNATSKeyRoundTrip: policyKey and idOfKey are a bijection between
// valid policy ids and the keys idOfKey accepts, so no two keys name one id.
func FuzzNATSKeyRoundTrip(f *testing.F) {
	for _, s := range []string{"team.a", "team=a", "policy.team.a", "policy.team=a", "a..b.", "..", ".", "policy.", "x/y", "policy.a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// s as a key: accepted only if it is the key of the id it names.
		if id, ok := idOfKey(s); ok {
			if got := policyKey(id); got != s {
				t.Fatalf("key %q -> id %q -> key %q: an alias", s, id, got)
			}
			if !validID(id) {
				t.Fatalf("key %q -> id %q, not a valid id", s, id)
			}
		}
		// s as an id: every valid id survives the round trip.
		if validID(s) {
			id, ok := idOfKey(policyKey(s))
			if !ok || id != s {
				t.Fatalf("id %q -> key %q -> %q, %v", s, policyKey(s), id, ok)
			}
		}
	})
}

// validID is whether policy validation accepts id (as the one policy of a file).
func validID(id string) bool {
	if id == "" || strings.ContainsAny(id, "\n") {
		return false
	}
	f := &policy.File{Policies: []policy.Policy{{
		ID:     id,
		Per:    []policy.Field{policy.FieldTenant},
		Limits: []policy.Limit{{Name: "l", Algorithm: "token_bucket", Limit: 1, Period: policy.Duration(1e9)}},
	}}}
	_, err := policy.Compile("fuzz", f)
	return err == nil
}
