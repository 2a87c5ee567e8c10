package policy

import (
	"net/netip"

	"github.com/allot-dev/allot/internal/bucket"
)

// Subject is the counter subject of r under p: its Per fields and their
// values. Requests with equal subjects share counters. Values are escaped
// so the subject is safe inside a Redis hash tag.
func (p *Compiled) Subject(r *Request, tier string) string {
	var buf [128]byte
	return string(p.AppendSubject(buf[:0], r, tier))
}

// Key is the Redis key of limit l for subject: rl:{<subject>}:<policy>:<limit>.
// The hash tag puts every limit of one subject in one cluster slot.
func (l *CompiledLimit) Key(subject string) string {
	return bucket.Render(subject, l.suffix)
}

func fieldValue(f Field, r *Request, tier string) string {
	switch f {
	case FieldTenant:
		return r.Tenant
	case FieldClient:
		return r.Client
	case FieldRoute:
		return r.Route
	case FieldMethod:
		return r.Method
	case FieldTier:
		return tier
	case FieldIP:
		if r.IP.IsValid() {
			return CanonicalIP(r.IP).String()
		}
	}
	return ""
}

// AppendSubject appends p's counter subject for r to dst and returns it:
// the bytes of Subject(r, tier), without allocating when dst has room.
// The leased path hashes it to find a key's lease with no string built.
func (p *Compiled) AppendSubject(dst []byte, r *Request, tier string) []byte {
	if len(p.Per) == 0 {
		return append(dst, '*')
	}
	for i, f := range p.Per {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, f...)
		dst = append(dst, '=')
		if f == FieldIP {
			dst = appendIP(dst, r.IP)
			continue
		}
		dst = appendEscaped(dst, fieldValue(f, r, tier))
	}
	return dst
}

func appendIP(dst []byte, a netip.Addr) []byte {
	if !a.IsValid() {
		return dst
	}
	var buf [64]byte
	return appendEscapedBytes(dst, CanonicalIP(a).AppendTo(buf[:0]))
}

// appendEscaped percent-encodes the bytes that would break a key or its
// hash tag ({ } % , =), without allocating.
func appendEscaped(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		dst = appendByte(dst, s[i])
	}
	return dst
}

func appendEscapedBytes(dst []byte, b []byte) []byte {
	for _, c := range b {
		dst = appendByte(dst, c)
	}
	return dst
}

func appendByte(dst []byte, c byte) []byte {
	switch c {
	case '{', '}', '%', ',', '=':
		const hex = "0123456789ABCDEF"
		return append(dst, '%', hex[c>>4], hex[c&15])
	}
	return append(dst, c)
}
