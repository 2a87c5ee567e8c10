package policy_test

import (
	"net/netip"
	"testing"

	"github.com/allot-dev/allot/policy"
)

// FuzzParseIP: the canonical form has no zone and no IPv4 mapping, is a
// fixed point, and is what any spelling of the same address parses to.
func FuzzParseIP(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "::ffff:10.0.0.1", "fe80::1%eth0", "FE80::1", "::", "1.2.3", "::ffff:1.2.3.4%x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := policy.ParseIP(s)
		raw, rawErr := netip.ParseAddr(s)
		if (err == nil) != (rawErr == nil) {
			t.Fatalf("%q: ParseIP err %v, netip err %v", s, err, rawErr)
		}
		if err != nil {
			return
		}
		if a.Zone() != "" || a.Is4In6() {
			t.Fatalf("%q -> %v: not canonical", s, a)
		}
		if b, err := policy.ParseIP(a.String()); err != nil || b != a {
			t.Fatalf("%q -> %v -> %v, %v: not a fixed point", s, a, b, err)
		}
		if want := raw.WithZone("").Unmap(); a != want {
			t.Fatalf("%q -> %v, want %v", s, a, want)
		}
		if raw.Is6() && !raw.Is4In6() {
			// The same address spelled in full (no compression) is one key.
			full := netip.AddrFrom16(raw.As16()).StringExpanded()
			if b, _ := policy.ParseIP(full); b != a {
				t.Fatalf("%q and %q differ: %v, %v", s, full, a, b)
			}
		}
	})
}
