package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The coordinator's scripts (package coord), each common.lua followed by
// its own file like the node's.
var (
	//go:embed share.lua
	shareSrc string
	//go:embed quota.lua
	quotaSrc string
	//go:embed lock_hold.lua
	lockHoldSrc string
	//go:embed lock_release.lua
	lockReleaseSrc string
)

// Share is share.lua: it sets a region's share of a global token bucket,
// refilling at the old rate first. KEYS[1] is the bucket; ARGV is the new
// rate and burst, the rate and burst in force without a share, and the
// TTL in ms. It returns 1.
var Share = redis.NewScript(commonSrc + shareSrc)

// Quota is quota.lua: it raises the other regions' count of a global
// quota in this region's bucket. ARGV is the window number, the count and
// the period in ms. It returns 1 if the bucket changed, else 0.
var Quota = redis.NewScript(commonSrc + quotaSrc)

// LockHold is lock_hold.lua: it acquires or renews a coordinator lock.
// ARGV is the holder's id and the TTL in ms. It returns 1 if held.
var LockHold = redis.NewScript(commonSrc + lockHoldSrc)

// LockRelease is lock_release.lua: it releases a coordinator lock its
// holder (ARGV[1]) holds. It returns 1 if released.
var LockRelease = redis.NewScript(commonSrc + lockReleaseSrc)

// coordSource is Source for the coordinator's scripts.
func coordSource(s *redis.Script) string {
	switch s {
	case Share:
		return commonSrc + shareSrc
	case Quota:
		return commonSrc + quotaSrc
	case LockHold:
		return commonSrc + lockHoldSrc
	case LockRelease:
		return commonSrc + lockReleaseSrc
	}
	return ""
}
