package region

import (
	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lua"
)

// checkScript is the script that takes groups: lua.CheckTB when every
// item is a token bucket (the common case, about half the Redis CPU of
// the general script), else lua.Check. Both have the same KEYS, ARGV and
// reply, so arguments and parsing do not depend on the choice. One group
// or a whole call's groups may be passed.
func checkScript(groups ...algorithm.Group) *redis.Script {
	for _, g := range groups {
		for _, it := range g {
			if it.Spec.Algorithm != algorithm.TokenBucket {
				return lua.Check
			}
		}
	}
	return lua.CheckTB
}
