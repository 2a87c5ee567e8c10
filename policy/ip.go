package policy

import "net/netip"

// ParseIP is the one place a request's IP becomes the address its counters
// and match.ip prefixes see, for every face (gRPC, HTTP /v1/check, Envoy,
// the middleware). It returns the canonical form, so that every spelling
// of one address shares one bucket:
//
//   - an IPv4-mapped IPv6 address (::ffff:10.0.0.1) is the IPv4 address;
//   - an IPv6 zone (fe80::1%eth0) is dropped. A zone names an interface of
//     the host that saw the packet, not part of the caller's address: kept,
//     it made every suffix a fresh bucket and no prefix contain the
//     address (netip.Prefix.Contains is false for a zoned address).
//     Dropping it rather than rejecting matches what the middleware has
//     always done with a zoned peer address, so no existing caller breaks;
//   - netip's own rendering (lower case, longest zero run compressed) is the
//     text, so "FE80:0::1" and "fe80::1" are one key.
func ParseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, err
	}
	return CanonicalIP(a), nil
}

// CanonicalIP is ParseIP for an address already parsed.
func CanonicalIP(a netip.Addr) netip.Addr {
	if !a.IsValid() {
		return a
	}
	return a.WithZone("").Unmap()
}
