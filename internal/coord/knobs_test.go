package coord

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/allot-dev/allot/policy"
)

func TestKnobsWithSettingsBlock(t *testing.T) {
	flags := DefaultKnobs()
	assert.Equal(t, flags, flags.With(nil))
	assert.Equal(t, flags, flags.With(&policy.RebalanceKnobs{}), "absent knobs keep the flags")

	zero, half := 0.0, 0.5
	got := flags.With(&policy.RebalanceKnobs{Interval: policy.Duration(2 * time.Second), Decay: &half, Floor: &zero, QuotaThreshold: &half})
	want := flags
	want.Interval, want.Decay, want.Floor, want.QuotaThreshold = 2*time.Second, 0.5, 0, 0.5
	assert.Equal(t, want, got)
}

// The settings validator and Knobs.Validate agree at the edges of every
// range, so a document that validates is accepted by SetKnobs (unless it
// clashes with a flag the document leaves alone).
func TestSettingsRangesMatchKnobsValidate(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		r  policy.RebalanceKnobs
		ok bool
	}{
		{policy.RebalanceKnobs{Interval: policy.Duration(10 * time.Millisecond), ShareTTL: policy.Duration(20 * time.Millisecond)}, true},
		{policy.RebalanceKnobs{Interval: policy.Duration(9 * time.Millisecond), ShareTTL: policy.Duration(20 * time.Millisecond)}, false},
		{policy.RebalanceKnobs{Gather: f(0.45)}, true},
		{policy.RebalanceKnobs{Gather: f(0.46)}, false},
		{policy.RebalanceKnobs{Gather: f(0)}, false},
		{policy.RebalanceKnobs{HeavyHitter: f(0), Floor: f(1), Decay: f(0)}, true},
		{policy.RebalanceKnobs{Decay: f(1.01)}, false},
		{policy.RebalanceKnobs{QuotaThreshold: f(1)}, true},
		{policy.RebalanceKnobs{QuotaThreshold: f(-0.01)}, false},
		{policy.RebalanceKnobs{Headroom: f(10)}, true},
		{policy.RebalanceKnobs{Headroom: f(10.5)}, false},
		{policy.RebalanceKnobs{Smoothing: f(1)}, true},
		{policy.RebalanceKnobs{Smoothing: f(0)}, false},
		{policy.RebalanceKnobs{Interval: policy.Duration(time.Minute), ShareTTL: policy.Duration(119 * time.Second)}, false},
	} {
		r := c.r
		docErr := policy.Validate("t", &policy.File{Rebalance: &r})
		knobErr := DefaultKnobs().With(&r).Validate()
		require.Equal(t, c.ok, docErr == nil, "document %+v: %v", r, docErr)
		require.Equal(t, c.ok, knobErr == nil, "knobs %+v: %v", r, knobErr)
	}
}
