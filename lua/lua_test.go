package lua_test

import (
	"context"
	"crypto/sha1"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/internal/redistest"
	"github.com/allot-dev/allot/lua"
)

// The happy paths are tested through package region; here the scripts'
// own argument checks, which region never lets through.
func TestScriptsRejectBadArguments(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	ctx := context.Background()
	keys := []string{"rl:{s}:a"}
	for name, args := range map[string][]any{
		"short ARGV":        {"tb", 10, 1000, 0},
		"unknown algorithm": {"xx", 10, 1000, 0, 1},
		"non-numeric":       {"tb", "ten", 1000, 0, 1},
		"zero period":       {"tb", 10, 0, 0, 1},
		"negative cost":     {"tb", 10, 1000, 0, -1},
	} {
		for _, s := range []*redis.Script{lua.Check, lua.Refund} {
			err := s.Run(ctx, c, keys, args...).Err()
			require.Error(t, err, name)
			assert.Contains(t, err.Error(), "allot:", name)
		}
	}
	n, err := c.Exists(ctx, keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a rejected call writes nothing")
}

func TestCheckReply(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.Server(t).Addr})
	defer c.Close()
	ctx := context.Background()
	// burst 0 means burst = limit: 10 tokens, 10 per second.
	v, err := lua.Check.Run(ctx, c, []string{"rl:{s}:a", "rl:{s}:b"}, "tb", 10, 1000, 0, 4, "tb", 1, 3600000, 2, 1).Int64Slice()
	require.NoError(t, err)
	require.Len(t, v, 1+3*2)
	assert.Equal(t, []int64{1, 6, 0, 400000, 1, 0, 3600000000}, v)
}

func TestSourceOfEveryScript(t *testing.T) {
	for _, sc := range []*redis.Script{lua.Check, lua.Refund, lua.Lease, lua.Return} {
		src := lua.Source(sc)
		if sum := fmt.Sprintf("%x", sha1.Sum([]byte(src))); src == "" || sum != sc.Hash() {
			t.Errorf("Source of %s: %d bytes hashing to %s", sc.Hash(), len(src), sum)
		}
	}
	if lua.Source(redis.NewScript("return 1")) != "" {
		t.Error("a foreign script has a source")
	}
}
