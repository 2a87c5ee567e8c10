// Package bucket owns the Redis bucket contract's key: every package that
// builds or reads a bucket key does it here. A key is
//
//	rl:{<subject>}:<policy>:<limit>
//
// The braces are a Redis Cluster hash tag: every limit of one subject
// lives in one slot, so a check over them is one script call. The subject
// is escaped (policy.AppendSubject escapes '{', '}', '%', ',' and '='), so
// the last "}:" of a key ends it; policy ids and limit names contain no
// ':'. The hash fields and scripts are package lua's.
package bucket

import (
	"errors"
	"fmt"
	"strings"
)

const (
	prefix = "rl:{" // a key's start, up to its subject
	closer = "}"    // the subject's end
)

// Key is a parsed bucket key.
type Key struct {
	Subject string // escaped counter subject, the hash tag
	Policy  string
	Limit   string
}

// New is the key of limit of policy for subject.
func New(subject, policy, limit string) Key {
	return Key{Subject: subject, Policy: policy, Limit: limit}
}

// String renders the key.
func (k Key) String() string { return Render(k.Subject, Suffix(k.Policy, k.Limit)) }

// Name is the key's "<policy>:<limit>": what identifies its limit in a
// policy set, whatever the subject.
func (k Key) Name() string { return Name(k.Policy, k.Limit) }

// Name is "<policy>:<limit>", the limit's identity in a policy set.
func Name(policy, limit string) string { return policy + ":" + limit }

// Suffix is what follows a key's hash tag for limit of policy,
// precomputed once per limit so that rendering a key on the hot path is
// one concatenation (Render).
func Suffix(policy, limit string) string { return closer + ":" + Name(policy, limit) }

// Render is the key of subject with a precomputed Suffix: the one place
// the key format is written.
func Render(subject, suffix string) string { return prefix + subject + suffix }

// HashTag is the part of a key Redis Cluster hashes: the subject.
func (k Key) HashTag() string { return k.Subject }

// ErrNotBucket says a string is not a bucket key.
var ErrNotBucket = errors.New("not a bucket key rl:{<subject>}:<policy>:<limit>")

// Parse reads a bucket key: the one place the key format is read.
func Parse(s string) (Key, error) {
	i := strings.LastIndex(s, closer+":")
	if !strings.HasPrefix(s, prefix) || i < len(prefix) {
		return Key{}, fmt.Errorf("%q: %w", s, ErrNotBucket)
	}
	pol, lim, ok := strings.Cut(s[i+2:], ":")
	if !ok || pol == "" || lim == "" || strings.Contains(lim, ":") {
		return Key{}, fmt.Errorf("%q: %w", s, ErrNotBucket)
	}
	return Key{Subject: s[len(prefix):i], Policy: pol, Limit: lim}, nil
}

// HasSubject reports whether s is a key of subject, without parsing or
// allocating (the hot path groups a request's keys by subject).
func HasSubject(s, subject string) bool {
	return len(s) > len(prefix)+len(subject) && strings.HasPrefix(s, prefix) &&
		s[len(prefix):len(prefix)+len(subject)] == subject && s[len(prefix)+len(subject):len(prefix)+len(subject)+1] == closer
}
