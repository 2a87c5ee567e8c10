package lease

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Abort is a crash: the unspent tokens stay debited from the region (it
// reports how many), Take fails, and a later Close returns nothing.
func TestAbortStrandsUnspent(t *testing.T) {
	m, src, s, lim := spentForty(t)
	before := src.tokens("rl:{c}:p:l", s)
	stranded := m.Abort()
	assert.InDelta(t, 60-before, float64(stranded), 0.01, "every token leased and not spent is reported stranded")
	assert.Positive(t, stranded)
	assert.InDelta(t, before, src.tokens("rl:{c}:p:l", s), 0.01, "nothing comes back to the region")
	_, err := m.Take(context.Background(), lim, []byte("c"), 1)
	assert.ErrorIs(t, err, ErrClosed)
	require.NoError(t, m.Close(context.Background()))
	assert.InDelta(t, before, src.tokens("rl:{c}:p:l", s), 0.01, "Close after Abort returns nothing")
	assert.Zero(t, m.Abort(), "a second Abort drops nothing")
	assert.Zero(t, m.Stats().Returned)
}
