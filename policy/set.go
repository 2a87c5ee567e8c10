package policy

import (
	"net/netip"
	"slices"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/internal/bucket"
)

// Request is what a policy is matched against: one check, from the
// decoded wire message to its decision. A face fills it with the
// fields as sent and validates it in place (decide.Validate) before
// anything matches it.
type Request struct {
	Tenant string
	Client string
	Route  string
	Method string
	// IPText is the client IP as it was sent; IP is what matching reads,
	// parsed from it by the validation of the face that took the request
	// (decide.Validate).
	IPText string
	IP     netip.Addr
	Tier   string
	Cost   int64 // > 0 overrides the route's cost
}

// Set is a compiled, immutable policy set. It is safe for concurrent use
// and is swapped whole on reload.
type Set struct {
	source      string
	tenants     map[string]string
	defaultTier string
	costs       costTable
	policies    []*Compiled
	lease       LeaseKnobs // the file's lease block: set-wide defaults
	// The index: each policy is filed under its most selective exact
	// matcher, so a lookup reads a few short lists instead of every policy.
	// A long list (many route policies of one tier, or without any exact
	// matcher) is indexed again by route; see candidates.
	byTenant map[string]*candidates
	byClient map[string]*candidates
	byTier   map[string]*candidates
	rest     *candidates
}

// Compiled is one validated policy ready to match.
type Compiled struct {
	ID             string
	Version        int64
	Per            []Field
	Limits         []CompiledLimit
	Leased         bool
	Shadow         bool
	Global         bool
	OnStoreFailure string
	Lease          LeaseKnobs // zero knobs take the node's defaults
	order          int
	match          Match
	route          glob
	prefix         netip.Prefix
	hasIP          bool
}

// CompiledLimit is one limit of a compiled policy.
type CompiledLimit struct {
	Name string
	Spec algorithm.Spec
	// suffix is the key's bucket.Suffix, precomputed for key building.
	suffix string
}

// Compile validates f as a whole and compiles it. A file that does not
// validate returns a *ValidationError listing every problem.
func Compile(source string, f *File) (*Set, error) {
	if err := Validate(source, f); err != nil {
		return nil, err
	}
	s := &Set{
		source:      source,
		tenants:     f.Tenants,
		defaultTier: f.DefaultTier,
		costs:       compileCosts(f.Costs),
		byTenant:    map[string]*candidates{},
		byClient:    map[string]*candidates{},
		byTier:      map[string]*candidates{},
		rest:        &candidates{},
	}
	if f.Lease != nil {
		s.lease = *f.Lease
	}
	for i := range f.Policies {
		c := compilePolicy(i, &f.Policies[i])
		s.policies = append(s.policies, c)
		switch m := c.match; {
		case m.Tenant != "":
			fileUnder(s.byTenant, m.Tenant, i)
		case m.Client != "":
			fileUnder(s.byClient, m.Client, i)
		case m.Tier != "":
			fileUnder(s.byTier, m.Tier, i)
		default:
			s.rest.list = append(s.rest.list, i)
		}
	}
	for _, m := range [...]map[string]*candidates{s.byTenant, s.byClient, s.byTier} {
		for _, c := range m {
			c.index(s.policies)
		}
	}
	s.rest.index(s.policies)
	return s, nil
}

func fileUnder(m map[string]*candidates, key string, i int) {
	c := m[key]
	if c == nil {
		c = &candidates{}
		m[key] = c
	}
	c.list = append(c.list, i)
}

// Load parses, validates and compiles a policy file's bytes.
func Load(source string, data []byte) (*Set, error) {
	f, err := Parse(source, data)
	if err != nil {
		return nil, err
	}
	return Compile(source, f)
}

func compilePolicy(i int, p *Policy) *Compiled {
	c := &Compiled{
		ID:             p.ID,
		Version:        p.Version,
		Per:            p.Per,
		Leased:         p.Precision == PrecisionLeased,
		Shadow:         p.Mode == ModeShadow,
		Global:         p.Scope == ScopeGlobal,
		OnStoreFailure: p.OnStoreFailure,
		order:          i,
		match:          p.Match,
		route:          glob(p.Match.Route),
	}
	if p.Lease != nil {
		c.Lease = *p.Lease
	}
	if c.OnStoreFailure == "" {
		c.OnStoreFailure = FailOpen
	}
	if p.Match.IP != "" {
		c.prefix, _ = parsePrefix(p.Match.IP) // validated
		c.hasIP = true
	}
	for _, l := range p.Limits {
		a, _ := algorithm.Parse(l.Algorithm) // validated
		c.Limits = append(c.Limits, CompiledLimit{
			Name:   l.Name,
			Spec:   algorithm.Spec{Algorithm: a, Limit: l.Limit, Period: time.Duration(l.Period), Burst: l.Burst},
			suffix: bucket.Suffix(p.ID, l.Name),
		})
	}
	return c
}

// Source names where the set came from.
func (s *Set) Source() string { return s.source }

// Len is the number of policies.
func (s *Set) Len() int { return len(s.policies) }

// Tier resolves the request's tier: its own, else its tenant's, else the
// default.
func (s *Set) Tier(r *Request) string {
	if r.Tier != "" {
		return r.Tier
	}
	if t, ok := s.tenants[r.Tenant]; ok {
		return t
	}
	return s.defaultTier
}

// Cost is the request's token cost: its own when > 0, else the route's,
// else 1.
func (s *Set) Cost(r *Request) int64 {
	if r.Cost > 0 {
		return r.Cost
	}
	return s.costs.lookup(r.Method, r.Route)
}

// Match appends to dst the policies that apply to r, in file order, and
// returns it. tier must be s.Tier(r).
func (s *Set) Match(r *Request, tier string, dst []*Compiled) []*Compiled {
	start := len(dst)
	for _, c := range [...]*candidates{s.byTenant[r.Tenant], s.byClient[r.Client], s.byTier[tier], s.rest} {
		dst = c.match(s.policies, r, tier, dst)
	}
	out := dst[start:]
	slices.SortFunc(out, func(a, b *Compiled) int { return a.order - b.order })
	return dst
}

func (p *Compiled) matches(r *Request, tier string) bool {
	m := &p.match
	if m.Tenant != "" && m.Tenant != r.Tenant {
		return false
	}
	if m.Client != "" && m.Client != r.Client {
		return false
	}
	if m.Tier != "" && m.Tier != tier {
		return false
	}
	if m.Route != "" && !p.route.match(r.Route) {
		return false
	}
	if p.hasIP && (!r.IP.IsValid() || !p.prefix.Contains(CanonicalIP(r.IP))) {
		return false
	}
	return true
}

// Each calls fn for every policy of the set, in file order.
func (s *Set) Each(fn func(*Compiled)) {
	for _, p := range s.policies {
		fn(p)
	}
}
