package bucket

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRenderParseRoundTrip(t *testing.T) {
	for _, k := range []Key{
		New("tenant=acme", "api", "rps"),
		New("tenant=a%7Db,route=/x", "global", "daily"), // an escaped '}' in the subject
		New("", "p", "l"),
	} {
		s := k.String()
		got, err := Parse(s)
		require.NoError(t, err, s)
		assert.Equal(t, k, got)
		assert.Equal(t, Render(k.Subject, Suffix(k.Policy, k.Limit)), s)
		assert.Equal(t, k.Policy+":"+k.Limit, got.Name())
		assert.True(t, HasSubject(s, k.Subject), s)
		assert.False(t, HasSubject(s, k.Subject+"x"), s)
	}
	assert.Equal(t, "rl:{tenant=acme}:api:rps", New("tenant=acme", "api", "rps").String(), "the documented format")
	assert.Equal(t, "tenant=acme", New("tenant=acme", "api", "rps").HashTag())
}

func TestParseRejects(t *testing.T) {
	for _, s := range []string{"", "rl:{x}", "rl:{x}:p", "rl:{x}:p:", "rl:{x}::l", "xx:{x}:p:l", "rl:{x}:p:l:m", "allot:coordinator:{eu}"} {
		_, err := Parse(s)
		assert.True(t, errors.Is(err, ErrNotBucket), "%q: %v", s, err)
	}
	assert.False(t, HasSubject("rl:{ab", "ab"))
	assert.False(t, HasSubject("xx:{ab}:p:l", "ab"))
}
