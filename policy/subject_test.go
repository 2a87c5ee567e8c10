package policy

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAppendSubjectMatchesSubject(t *testing.T) {
	for _, per := range [][]Field{nil, {FieldTenant}, {FieldTenant, FieldIP}, {FieldClient, FieldRoute, FieldMethod, FieldTier}, {FieldIP}} {
		p := &Compiled{Per: per}
		for _, r := range []Request{
			{Tenant: "acme", Client: "u1", Route: "/v1/x", Method: "GET", IP: netip.MustParseAddr("10.0.0.1")},
			{Tenant: "a{b}c%d,e=f", Client: "é", IP: netip.MustParseAddr("::ffff:1.2.3.4")},
			{Tenant: "x", IP: netip.MustParseAddr("2001:db8::1")},
			{Tenant: "no-ip"},
		} {
			var buf [16]byte
			assert.Equal(t, p.Subject(&r, "pro"), string(p.AppendSubject(buf[:0], &r, "pro")))
		}
	}
}

func TestAppendSubjectDoesNotAllocate(t *testing.T) {
	p := &Compiled{Per: []Field{FieldTenant, FieldIP}}
	r := Request{Tenant: "acme", IP: netip.MustParseAddr("10.1.2.3")}
	var buf [128]byte
	allocs := testing.AllocsPerRun(100, func() { _ = p.AppendSubject(buf[:0], &r, "") })
	assert.Zero(t, allocs)
}
