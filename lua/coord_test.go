package lua_test

import (
	"crypto/sha1"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/lua"
)

// The coordinator's scripts are this package's too: Source knows them.
// (Their behaviour is tested in package coord against check.lua.)
func TestSourceOfCoordinatorScripts(t *testing.T) {
	for _, sc := range []*redis.Script{lua.Share, lua.Quota, lua.LockHold, lua.LockRelease} {
		src := lua.Source(sc)
		if sum := fmt.Sprintf("%x", sha1.Sum([]byte(src))); src == "" || sum != sc.Hash() {
			t.Errorf("Source of %s: %d bytes hashing to %s", sc.Hash(), len(src), sum)
		}
	}
}
