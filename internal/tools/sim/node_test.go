package sim

import "testing"

// The managers' fixed hash is pinned (which keys share a refill round, and
// so every run's bytes, follow from it), and its top bits (a lease
// manager's stripe: the top 8) spread: 256 subjects must not crowd a few
// stripes, or a few refill rounds would batch every key.
func TestSubjectHashIsFixedAndSpreads(t *testing.T) {
	if h := subjectHash([]byte("user:42")); h != 0x998817bee6718248 {
		t.Fatalf("subjectHash(user:42) = %#x: the hash changed, and with it which keys share a refill round", h)
	}
	top := map[uint64]bool{}
	for i := range 256 {
		top[subjectHash([]byte{byte(i)})>>56] = true
	}
	if len(top) <= 100 {
		t.Fatalf("256 subjects in %d of 256 stripes", len(top))
	}
}
