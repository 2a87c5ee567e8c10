// Package lua holds Allot's Redis scripts, embedded at build time and
// exposed as go-redis Scripts.
//
// Every script works on the keys of one subject (one hash slot), reads the
// clock with redis.call('TIME') and is the twin of the maths in package
// algorithm. See the header of each .lua file for its KEYS/ARGV contract.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed check.lua
	checkSrc string
	//go:embed refund.lua
	refundSrc string
)

// Check is check.lua: the all-or-nothing take over one subject's buckets.
// KEYS are the bucket keys; ARGV has 5 values per key (algorithm code,
// limit, period in ms, burst, cost). It returns {allowed, then remaining,
// retry_us, reset_us per key}.
//
// A *redis.Script only caches its source and SHA1, so sharing it is safe.
var Check = redis.NewScript(checkSrc)

// Refund is refund.lua: it credits back what a successful Check took, with
// the same KEYS and ARGV. It returns the number of buckets credited.
var Refund = redis.NewScript(refundSrc)

// ArgsPerKey is how many ARGV values each key takes in Check and Refund.
const ArgsPerKey = 5
