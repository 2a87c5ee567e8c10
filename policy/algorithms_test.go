package policy

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryAlgorithmSpellingLoads(t *testing.T) {
	set := load(t, `
policies:
  - id: all
    limits:
      - {name: a, algorithm: token_bucket, limit: 5, period: 1s, burst: 10}
      - {name: b, algorithm: gcra, limit: 5, period: 1s, burst: 10}
      - {name: c, algorithm: sliding_window_log, limit: 5, period: 1m}
      - {name: d, algorithm: sliding_window_counter, limit: 1000, period: 1m}
      - {name: e, algorithm: fixed_window, limit: 100000, period: 24h}
`)
	require.Equal(t, 1, set.Len())
}

func TestAlgorithmRules(t *testing.T) {
	_, err := Load("p.yaml", []byte(`
policies:
  - id: leased-window
    precision: leased
    limits:
      - {name: ok, algorithm: token_bucket, limit: 5, period: 1s}
      - {name: day, algorithm: fixed_window, limit: 5, period: 24h}
      - {name: otp, algorithm: sliding_window_log, limit: 20000, period: 1m}
      - {name: sw, algorithm: sliding_window_counter, limit: 5, period: 1m, burst: 9}
      - {name: ms, algorithm: token_bucket, limit: 5, period: 1500us}
  - id: exact-window
    precision: exact
    limits:
      - {name: day, algorithm: fixed_window, limit: 5, period: 24h}
`))
	var ve *ValidationError
	require.True(t, errors.As(err, &ve), "%v", err)
	got := map[string]string{}
	for _, p := range ve.Problems {
		got[p.Policy+" "+p.Field] += p.Msg + "; "
	}
	assert.Contains(t, got["leased-window limits[1].algorithm"], "fixed_window cannot be leased")
	// The advice names what can be leased, and only that: gcra cannot.
	assert.Contains(t, got["leased-window limits[1].algorithm"], "use token_bucket, or precision: exact")
	assert.NotContains(t, got["leased-window limits[1].algorithm"], "gcra")
	assert.Contains(t, got["leased-window limits[2].algorithm"], "sliding_window_log cannot be leased")
	assert.Contains(t, got["leased-window limits[2].algorithm"], "limit 20000 is above 10000")
	assert.Contains(t, got["leased-window limits[3].algorithm"], "has no burst")
	assert.Contains(t, got["leased-window limits[4].algorithm"], "whole number of milliseconds")
	assert.NotContains(t, got, "leased-window limits[0].algorithm", "token_bucket can be leased")
	assert.NotContains(t, got, "exact-window limits[0].algorithm", "exact precision takes any algorithm")
	assert.Len(t, ve.Problems, 6, "%v", err)
}

// Issue 13 point 7: numbers within each field's range whose combination
// the scripts cannot compute (algorithm.Spec.Validate's bounds) are
// refused at load, with the largest burst that would do; that burst loads.
func TestNumbersTheScriptsCannotHold(t *testing.T) {
	_, err := Load("p.yaml", []byte(`
policies:
  - id: yearly
    limits:
      - {name: a, algorithm: token_bucket, limit: 1, period: 8784h, burst: 3162316}
      - {name: b, algorithm: gcra, limit: 1, period: 8784h, burst: 72}
`))
	var ve *ValidationError
	require.True(t, errors.As(err, &ve), "%v", err)
	require.Len(t, ve.Problems, 2, "%v", err)
	assert.Equal(t, "limits[0].algorithm", ve.Problems[0].Field)
	assert.Contains(t, ve.Problems[0].Msg, "3.17e+06 years")
	assert.Contains(t, ve.Problems[0].Msg, "at most burst 71 for this limit and period")
	assert.Contains(t, ve.Problems[1].Msg, "at most burst 71 for this limit and period")

	set := load(t, `
policies:
  - id: yearly
    limits:
      - {name: a, algorithm: token_bucket, limit: 1, period: 8784h, burst: 71}
      - {name: b, algorithm: gcra, limit: 1, period: 8784h, burst: 71}
`)
	require.Equal(t, 1, set.Len())
}
