// Package lua holds Allot's Redis scripts, embedded at build time and
// exposed as go-redis Scripts.
//
// A call of check.lua, refund.lua, lease.lua, return.lua or part.lua
// works on the keys of one subject, which share a hash tag and so one
// hash slot. A call of check_tb.lua in its batch layout carries the
// groups of many subjects: package region sends that layout only to a
// single server, and on a Redis Cluster each group goes alone. The
// coordinator's scripts (coord.go) write one bucket's share or quota
// count (share.lua, quota.lua), or hold the region's lock key
// allot:coordinator:{region} (lock_hold.lua, lock_release.lua). Scripts
// that keep time read Redis's clock (redis.call('TIME')), never the
// caller's. The maths of check.lua, check_tb.lua and refund.lua is the
// twin of package algorithm's (Decide, Refund); the lease, return, part,
// share, quota and lock scripts have no twin there. See the header of
// each .lua file for its KEYS/ARGV contract.
//
// It opens no connection and runs no script itself: package region and
// package coord send them. What it computes in Go is the layout of
// CheckTB's arguments and the split of its reply.
package lua

import (
	_ "embed"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// Every script but CheckTB is common.lua followed by its own file (with
// params.lua between for Check and Refund): the helpers they share (the
// Redis clock, integer division, TTLs, windows) are written once.
// check_tb.lua stands alone, its helpers inlined for speed (its header
// says why).
//
//go:embed common.lua
var commonSrc string

var (
	// params.lua follows common.lua in check.lua and refund.lua: the ARGV
	// layout the two share.
	//go:embed params.lua
	paramsSrc string
	//go:embed check.lua
	checkSrc string
	//go:embed check_tb.lua
	checkTBSrc string
	//go:embed refund.lua
	refundSrc string
)

// Check is check.lua: the all-or-nothing take over one subject's buckets.
// KEYS are the bucket keys; ARGV has 5 values per key (algorithm code,
// limit, period in ms, burst, cost). It returns {allowed, then remaining,
// retry_us, reset_us per key}.
//
// A *redis.Script only caches its source and SHA1, so sharing it is safe.
var Check = redis.NewScript(commonSrc + paramsSrc + checkSrc)

// CheckTB is check_tb.lua: Check for groups whose keys are all token
// buckets, many groups per call, with the same maths and stored state
// and each group taken all-or-nothing as Check takes it, at about half
// Check's Redis CPU per group (docs/performance.md, "Redis CPU per
// check"). It refuses any other algorithm code. Its KEYS and ARGV
// for many groups are laid out by AppendCheckTB, and its reply is split by
// CheckTBReplies: one Check reply, or one error, per group. One group
// may also be sent with Check's KEYS and ARGV, for Check's reply (the
// cheaper form for a lone call).
var CheckTB = redis.NewScript(checkTBSrc)

// AppendCheckTB appends to cmd the key count, the KEYS and the ARGV of n
// groups in CheckTB's batch layout, as an EVALSHA command carries them
// after the script's hash. size(i) is group i's number of keys and
// key(i, j) its j-th key: the key as a command argument (a string, or a
// *string, which go-redis writes as the string it points to without the
// allocation of boxing a copy), its spec's first ArgsPerKey-1 arguments
// (algorithm code, limit, period in ms, burst) and its cost.
// ARGV is the number of groups, the number of distinct specs, those
// specs, then per group its number of keys and per key its spec's index
// and its cost. A key whose spec is not ArgsPerKey-1 values is sent with
// spec index 0, which the script refuses for that group alone.
//
// It is the one layout of the batch form (a node's pipelines and the
// tests' calls both use it), and it allocates nothing but cmd's growth:
// specs handed over as the same slice (a store's boxed spec cache) are
// matched by identity before their values are compared.
func AppendCheckTB(cmd []any, n int, size func(i int) int, key func(i, j int) (k any, spec []any, cost any)) []any {
	var table [8][]any
	specs := table[:0]
	nk := 0
	for i := range n {
		nk += size(i)
	}
	cmd = slices.Grow(cmd, 1+nk+2+4*len(table)+n+2*nk)
	cmd = append(cmd, nk)
	// One pass lays out the KEYS and gathers the distinct specs, the next
	// the groups: each key is asked for twice.
	for i := range n {
		for j := range size(i) {
			k, sp, _ := key(i, j)
			cmd = append(cmd, k)
			if len(sp) == ArgsPerKey-1 && specIndex(specs, sp) == 0 {
				specs = append(specs, sp)
			}
		}
	}
	cmd = append(cmd, n, len(specs))
	for _, sp := range specs {
		cmd = append(cmd, sp...)
	}
	for i := range n {
		m := size(i)
		cmd = append(cmd, m)
		for j := range m {
			_, sp, cost := key(i, j)
			if len(sp) != ArgsPerKey-1 {
				cmd = append(cmd, 0, 0)
				continue
			}
			cmd = append(cmd, specIndex(specs, sp), cost)
		}
	}
	return cmd
}

// specIndex is the 1-based index in specs of sp, or 0.
func specIndex(specs [][]any, sp []any) int {
	for i, s := range specs {
		if &s[0] == &sp[0] || sameArgs(s, sp) {
			return i + 1
		}
	}
	return 0
}

// sameArgs reports whether a and b hold equal values of the kinds a
// script argument takes; any other kind is never the same (== on an
// interface holding a slice would panic).
func sameArgs(a, b []any) bool {
	for i := range a {
		switch x := a[i].(type) {
		case string:
			if y, ok := b[i].(string); !ok || x != y {
				return false
			}
		case int64:
			if y, ok := b[i].(int64); !ok || x != y {
				return false
			}
		case int:
			if y, ok := b[i].(int); !ok || x != y {
				return false
			}
		case float64:
			if y, ok := b[i].(float64); !ok || x != y {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// CheckTBReplies splits a CheckTB reply for g groups: one element per
// group, each Check's reply ([]any of int64) or the group's own error (a
// redis.Error), or an error if the reply is not g elements.
func CheckTBReplies(val any, g int) ([]any, error) {
	vals, ok := val.([]any)
	if !ok {
		return nil, fmt.Errorf("check_tb.lua returned %T, not an array", val)
	}
	if len(vals) != g {
		return nil, fmt.Errorf("check_tb.lua returned %d replies for %d groups", len(vals), g)
	}
	return vals, nil
}

// Refund is refund.lua: it credits back what a successful Check took, with
// the same KEYS and ARGV. It returns the number of buckets credited.
var Refund = redis.NewScript(commonSrc + paramsSrc + refundSrc)

// ArgsPerKey is how many ARGV values each key takes in Check and Refund.
const ArgsPerKey = 5

var (
	//go:embed lease.lua
	leaseSrc string
	//go:embed return.lua
	returnSrc string
	//go:embed part.lua
	partSrc string
)

// Lease is lease.lua: it grants a node tokens from one subject's buckets
// to spend in memory, all-or-nothing on each key's need. KEYS are the
// bucket keys; ARGV has 5 values per key (limit, period in ms, burst,
// need, want). It returns {ok, then granted, left, retry_us, burst, rate,
// shared per key}; rate is a string, shared 1 while RLQS parts hold the
// bucket.
var Lease = redis.NewScript(commonSrc + leaseSrc)

// Return is return.lua: it credits back tokens a lease did not spend,
// decayed by the lease's age. ARGV has 5 values per key (limit, period in
// ms, burst, unspent, age in µs). It returns the whole tokens credited.
var Return = redis.NewScript(commonSrc + returnSrc)

// Part is part.lua: one node's settlement of a region bucket's RLQS
// parts. KEYS are the bucket and its parts hash; ARGV is limit, period in
// ms, burst, node, usage, TTL in ms and horizon in ms, then demand, held
// and want per consumer. It returns {avail, rate, burst, tokens,
// lease_rate, lease_unmet, a part per consumer, other nodes' demands}.
var Part = redis.NewScript(commonSrc + partSrc)

// Source returns the text of one of this package's scripts (for an EVAL
// that a caller builds itself), or "" for any other script.
func Source(s *redis.Script) string {
	switch s {
	case Check:
		return commonSrc + paramsSrc + checkSrc
	case CheckTB:
		return checkTBSrc
	case Refund:
		return commonSrc + paramsSrc + refundSrc
	case Lease:
		return commonSrc + leaseSrc
	case Return:
		return commonSrc + returnSrc
	case Part:
		return commonSrc + partSrc
	}
	return coordSource(s)
}
