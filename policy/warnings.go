package policy

import "fmt"

// Warnings lists what in f validates but probably does not do what its
// author meant; it never makes a set invalid. Today one case: a policy
// that keys on a field (per) its match does not require. A check without
// that field is counted under the empty value, one bucket shared by every
// such check (so that omitting a field never dodges a limit). That is a
// trap when the policy's match lets many unrelated callers in:
//
//   - per: [ip] without match.ip: ip is the field most often absent
//     (services calling from behind a proxy, batch clients), and every
//     check without it, of every tenant, shares one bucket (the example
//     ip-perimeter throttled 1,000 tenants at 200/s together). Match by
//     address family instead: match.ip 0.0.0.0/0 and ::/0;
//   - any other per field under an empty match (every request matches):
//     the same trap for that field.
func Warnings(f *File) []Problem {
	var out []Problem
	for i := range f.Policies {
		p := &f.Policies[i]
		empty := p.Match == Match{}
		for _, fl := range p.Per {
			var required bool
			switch fl {
			case FieldIP:
				required = p.Match.IP != ""
			case FieldTenant:
				required = !empty || p.Match.Tenant != ""
			case FieldClient:
				required = !empty || p.Match.Client != ""
			case FieldRoute, FieldMethod, FieldTier:
				// A tier always resolves (the request's, the tenant's or
				// default_tier); route and method are the request's own.
				required = !empty || fl == FieldTier
			}
			if required {
				continue
			}
			msg := fmt.Sprintf("keys on %s but its match does not require %s: every check without %s shares one bucket", fl, fl, fl)
			if fl == FieldIP {
				msg += `; match by address family (match.ip "0.0.0.0/0" and a twin policy with "::/0")`
			} else {
				msg += "; give the policy a match"
			}
			out = append(out, Problem{Policy: p.ID, Field: "per", Msg: msg})
		}
	}
	return out
}
