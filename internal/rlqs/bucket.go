package rlqs

import (
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/allot-dev/allot/internal/decide"
	"github.com/allot-dev/allot/policy"
)

// Bounds on a bucket id: a few keys, MaxIDBytes of keys and values in
// all (a stream's memory is at most MaxBuckets ids of it, twice: the
// canonical form, and the keys and values the request and updates share).
// Longer ids are refused, not truncated (a truncated id would merge
// buckets); a refused id's bucket keeps only its hash (refusedID) and why.
const (
	maxIDKeys  = 8
	MaxIDBytes = 1024
)

// bucketID validates id and returns its canonical form (the keys sorted,
// each key=value NUL-separated: the order of an id's keys does not
// matter, rlqs.proto "BucketId") and the check request it describes:
// each key names a check field by keys (the Envoy RLS face's mapping).
// An error says what is wrong, for the log and the deny-all answer.
func bucketID(id *rlqsv3.BucketId, keys map[string]policy.Field) (string, policy.Request, error) {
	m := id.GetBucket()
	if len(m) == 0 {
		return "", policy.Request{}, fmt.Errorf("empty bucket id")
	}
	if len(m) > maxIDKeys {
		return "", policy.Request{}, fmt.Errorf("bucket id has %d keys; at most %d", len(m), maxIDKeys)
	}
	names := make([]string, 0, len(m))
	size := 0
	for k, v := range m {
		size += len(k) + len(v)
		names = append(names, k)
	}
	if size > MaxIDBytes {
		return "", policy.Request{}, fmt.Errorf("bucket id is %d bytes of keys and values; at most %d", size, MaxIDBytes)
	}
	slices.Sort(names)
	var b strings.Builder
	var req decide.Request
	seen := map[*string]bool{}
	for _, k := range names {
		v := m[k]
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
		b.WriteByte(0)
		p := decide.Field(&req, keys[k])
		if p == nil {
			return "", policy.Request{}, fmt.Errorf("bucket id key %q names no check field (known: %s)", k, known(keys))
		}
		if seen[p] {
			return "", policy.Request{}, fmt.Errorf("bucket id sets %s twice", keys[k])
		}
		seen[p] = true
		*p = v
	}
	if err := decide.Validate(&req); err != nil {
		return "", policy.Request{}, fmt.Errorf("bucket id: %w", err)
	}
	return b.String(), req, nil
}

// refusedID names a refused bucket id by a hash of its keys and values
// (bounded, whatever their size), so that it is one bucket of its stream.
func refusedID(id *rlqsv3.BucketId) string {
	m := id.GetBucket()
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, k := range names {
		fmt.Fprintf(h, "%d:%s%d:%s", len(k), k, len(m[k]), m[k])
	}
	return "\x00refused\x00" + string(h.Sum(nil))
}

func known(keys map[string]policy.Field) string {
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
