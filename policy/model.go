// Package policy owns the policy model: the file format, its validation
// and the compiled, immutable Set that answers "which limits apply to this
// request, under which keys, at what cost".
//
// policy does no I/O beyond parsing bytes it is handed and never decides:
// counting belongs to the stores, deciding to package decide.
package policy

import (
	"encoding/json"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// File is a policy file as written by an operator.
type File struct {
	// Tenants maps a tenant id to its tier. A request's own tier wins.
	Tenants map[string]string `yaml:"tenants" json:"tenants"`
	// DefaultTier is the tier of a tenant not in Tenants.
	DefaultTier string `yaml:"default_tier" json:"default_tier"`
	// Costs maps "METHOD /path" or "/path" (with * globs) to a token cost.
	Costs map[string]int64 `yaml:"costs" json:"costs"`
	// Policies are all checked; a request passes only if every matching
	// enforced policy allows it.
	Policies []Policy `yaml:"policies" json:"policies"`
	// Rebalance tunes the multi-region coordinators at runtime; absent
	// knobs keep their command-line values.
	Rebalance *RebalanceKnobs `yaml:"rebalance" json:"rebalance,omitempty"`
	// Lease holds the node-wide lease defaults, tunable at runtime: a
	// leased policy's own lease block wins, absent knobs keep the node's
	// --lease-* flags.
	Lease *LeaseKnobs `yaml:"lease" json:"lease,omitempty"`
}

// Policy is one rule: the requests it matches, how they are grouped into
// counters (Per), and the limits each counter must respect.
type Policy struct {
	ID             string  `yaml:"id" json:"id"`
	Version        int64   `yaml:"version" json:"version,omitempty"`
	Match          Match   `yaml:"match" json:"match"`
	Per            []Field `yaml:"per" json:"per"`
	Limits         []Limit `yaml:"limits" json:"limits"`
	Precision      string  `yaml:"precision" json:"precision,omitempty"`
	Mode           string  `yaml:"mode" json:"mode,omitempty"`
	Scope          string  `yaml:"scope" json:"scope,omitempty"`
	OnStoreFailure string  `yaml:"on_store_failure" json:"on_store_failure,omitempty"`
	// Lease tunes a leased policy's leases; unset knobs take the node's.
	Lease *LeaseKnobs `yaml:"lease" json:"lease,omitempty"`
}

// Match selects requests. Every field that is set must hold; an empty
// Match matches every request.
type Match struct {
	Tier   string `yaml:"tier" json:"tier,omitempty"`
	Tenant string `yaml:"tenant" json:"tenant,omitempty"`
	Client string `yaml:"client" json:"client,omitempty"`
	Route  string `yaml:"route" json:"route,omitempty"` // glob: * matches any run of characters, / included
	IP     string `yaml:"ip" json:"ip,omitempty"`       // CIDR or a single address
}

// Limit is one limit of a policy: Limit tokens per Period, at most Burst
// at once (default Limit).
type Limit struct {
	Name      string   `yaml:"name" json:"name"`
	Algorithm string   `yaml:"algorithm" json:"algorithm"`
	Limit     int64    `yaml:"limit" json:"limit"`
	Period    Duration `yaml:"period" json:"period"`
	Burst     int64    `yaml:"burst" json:"burst,omitempty"`
}

// Field is a request field that can key a counter.
type Field string

// The fields a policy can count per.
const (
	FieldTenant Field = "tenant"
	FieldClient Field = "client"
	FieldRoute  Field = "route"
	FieldIP     Field = "ip"
	FieldMethod Field = "method"
	FieldTier   Field = "tier"
)

func (f Field) valid() bool {
	switch f {
	case FieldTenant, FieldClient, FieldRoute, FieldIP, FieldMethod, FieldTier:
		return true
	}
	return false
}

// Precision, mode, scope and store-failure spellings.
const (
	PrecisionExact  = "exact"
	PrecisionLeased = "leased"
	ModeEnforce     = "enforce"
	ModeShadow      = "shadow"
	ScopeRegion     = "region"
	ScopeGlobal     = "global"
	FailOpen        = "open"
	FailClosed      = "closed"
	FailLocal       = "local"
)

// Duration is a time.Duration written as a Go duration string ("1s",
// "24h") in YAML and JSON.
type Duration time.Duration

// UnmarshalYAML reads a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return fmt.Errorf("period: want a duration string such as \"1s\": %w", err)
	}
	return d.set(s)
}

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("period: want a duration string such as \"1s\": %w", err)
	}
	return d.set(s)
}

func (d *Duration) set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("period: %w", err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as a Go duration string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }
