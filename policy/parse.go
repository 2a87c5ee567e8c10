package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/allot-dev/allot/algorithm"
	"go.yaml.in/yaml/v3"
)

// Bounds on policy values; beyond them a number is a typo, not a policy.
const (
	MaxIDLen   = 128
	MaxLimit   = 1 << 40
	MaxPeriod  = 366 * 24 * time.Hour
	MinPeriod  = time.Millisecond
	MaxCost    = 1_000_000
	maxMatchLn = 1024
)

// Problem is one thing wrong with a policy file.
type Problem struct {
	Policy string // policy id, or "" for file-level fields
	Field  string // e.g. "limits[0].period"
	Msg    string
}

func (p Problem) String() string {
	if p.Policy == "" {
		return fmt.Sprintf("%s: %s", p.Field, p.Msg)
	}
	return fmt.Sprintf("policy %q: %s: %s", p.Policy, p.Field, p.Msg)
}

// ValidationError lists every problem of a rejected policy set.
type ValidationError struct {
	Source   string // file name or store key the set came from
	Problems []Problem
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: invalid policy set (%d problems)", e.Source, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// Parse decodes a policy file in YAML or JSON (JSON is YAML). Unknown
// fields are errors: a misspelt field silently ignored is a limit that is
// silently not enforced. source names the input in errors.
func Parse(source string, data []byte) (*File, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return &f, nil // an empty file is an empty policy set
		}
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return &f, nil
}

// Validate checks the file as a whole and returns a *ValidationError with
// every problem found, or nil.
func Validate(source string, f *File) error {
	v := validator{}
	v.file(f)
	if len(v.problems) == 0 {
		return nil
	}
	return &ValidationError{Source: source, Problems: v.problems}
}

type validator struct{ problems []Problem }

func (v *validator) add(policy, field, format string, args ...any) {
	v.problems = append(v.problems, Problem{Policy: policy, Field: field, Msg: fmt.Sprintf(format, args...)})
}

func (v *validator) file(f *File) {
	for tenant, tier := range f.Tenants {
		if tenant == "" || tier == "" {
			v.add("", "tenants", "tenant %q: tenant and tier must be non-empty", tenant)
		}
	}
	for pattern, cost := range f.Costs {
		if _, _, err := parseCostPattern(pattern); err != nil {
			v.add("", "costs", "%q: %v", pattern, err)
		}
		if cost < 1 || cost > MaxCost {
			v.add("", "costs", "%q: cost %d out of range [1, %d]", pattern, cost, MaxCost)
		}
	}
	v.settings(f)
	seen := make(map[string]int, len(f.Policies))
	for i := range f.Policies {
		p := &f.Policies[i]
		if j, dup := seen[p.ID]; dup && p.ID != "" {
			v.add(p.ID, "id", "duplicate id (policies[%d] and policies[%d])", j, i)
		}
		seen[p.ID] = i
		v.policy(i, p)
	}
}

func (v *validator) policy(i int, p *Policy) {
	id := p.ID
	switch {
	case id == "":
		id = fmt.Sprintf("policies[%d]", i)
		v.add(id, "id", "required")
	case len(id) > MaxIDLen || !validName(id):
		v.add(id, "id", "must be 1-%d characters of [A-Za-z0-9_.-]", MaxIDLen)
	case id == "." || id == "..":
		// Path segments: /v1/policies/.. is cleaned away before it can
		// reach the policy, so allotctl get/delete could not name it.
		v.add(id, "id", "%q is not a usable id (it is a path segment)", id)
	}
	v.match(id, &p.Match)
	perSeen := map[Field]bool{}
	for j, f := range p.Per {
		if !f.valid() {
			v.add(id, fmt.Sprintf("per[%d]", j), "unknown field %q (want tenant, client, route, ip, method or tier)", f)
		}
		if perSeen[f] {
			v.add(id, fmt.Sprintf("per[%d]", j), "%q listed twice", f)
		}
		perSeen[f] = true
	}
	if len(p.Limits) == 0 {
		v.add(id, "limits", "at least one limit is required")
	}
	names := map[string]bool{}
	for j := range p.Limits {
		v.limit(id, j, &p.Limits[j], names)
		v.limitFits(id, j, &p.Limits[j], p.Precision == PrecisionLeased)
	}
	oneOf(v, id, "precision", p.Precision, PrecisionExact, PrecisionLeased)
	oneOf(v, id, "mode", p.Mode, ModeEnforce, ModeShadow)
	oneOf(v, id, "scope", p.Scope, ScopeRegion, ScopeGlobal)
	oneOf(v, id, "on_store_failure", p.OnStoreFailure, FailOpen, FailClosed, FailLocal)
	v.lease(id, p)
	if p.Version < 0 {
		v.add(id, "version", "must be >= 0")
	}
}

func oneOf(v *validator, id, field, got string, allowed ...string) {
	if got == "" {
		return
	}
	for _, a := range allowed {
		if got == a {
			return
		}
	}
	v.add(id, field, "%q is not one of %s", got, strings.Join(allowed, ", "))
}

func (v *validator) match(id string, m *Match) {
	for field, val := range map[string]string{"match.tier": m.Tier, "match.tenant": m.Tenant, "match.client": m.Client, "match.route": m.Route} {
		if len(val) > maxMatchLn || !utf8.ValidString(val) {
			v.add(id, field, "must be valid UTF-8 of at most %d bytes", maxMatchLn)
		}
	}
	if m.IP != "" {
		if _, err := parsePrefix(m.IP); err != nil {
			v.add(id, "match.ip", "%v", err)
		}
	}
}

func (v *validator) limit(id string, j int, l *Limit, names map[string]bool) {
	at := func(f string) string { return fmt.Sprintf("limits[%d].%s", j, f) }
	switch {
	case l.Name == "":
		v.add(id, at("name"), "required")
	case !validName(l.Name) || len(l.Name) > MaxIDLen:
		v.add(id, at("name"), "must be 1-%d characters of [A-Za-z0-9_.-]", MaxIDLen)
	case names[l.Name]:
		v.add(id, at("name"), "duplicate limit name %q", l.Name)
	}
	names[l.Name] = true
	if _, err := algorithm.Parse(l.Algorithm); err != nil {
		v.add(id, at("algorithm"), "%v", err)
	}
	if l.Limit < 1 || l.Limit > MaxLimit {
		v.add(id, at("limit"), "%d out of range [1, %d]", l.Limit, int64(MaxLimit))
	}
	if p := time.Duration(l.Period); p < MinPeriod || p > MaxPeriod {
		v.add(id, at("period"), "%v out of range [%v, %v]", p, MinPeriod, MaxPeriod)
	}
	if l.Burst < 0 || l.Burst > MaxLimit {
		v.add(id, at("burst"), "%d out of range [0, %d] (0 means: = limit)", l.Burst, int64(MaxLimit))
	}
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		ok := r == '_' || r == '-' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not a CIDR: %w", err)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not an IP or CIDR: %w", err)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// parseCostPattern splits "METHOD /path" or "/path" into method and path.
func parseCostPattern(s string) (method, path string, err error) {
	method, path, found := strings.Cut(s, " ")
	if !found {
		method, path = "", s
	}
	if !strings.HasPrefix(path, "/") {
		return "", "", errors.New(`want "METHOD /path" or "/path"`)
	}
	return strings.ToUpper(method), path, nil
}
