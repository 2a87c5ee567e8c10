package rlqs

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMaxMin(t *testing.T) {
	inf := math.Inf(1)
	for _, tc := range []struct {
		rate, mine float64
		demands    []float64
		want       float64
	}{
		{1000, 5000, []float64{5000, 5000}, 500},
		{1000, 100, []float64{100, 5000}, 100},
		{1000, 5000, []float64{100, 5000}, 900},
		{1000, inf, []float64{inf}, 1000},
		{1000, inf, []float64{inf, 200, 300}, 500},
		{1000, 200, []float64{inf, 200, 300}, 200},
		{1000, 50, nil, 50},
		{900, 400, []float64{400, 400, 400}, 300},
	} {
		assert.InDelta(t, tc.want, maxMin(tc.rate, tc.mine, tc.demands), 1e-9, "%+v", tc)
	}
}

func TestSubscribersSplitAndForget(t *testing.T) {
	s := newSubscribers()
	a, b := &bucket{}, &bucket{}
	s.set("k", a, 5000)
	s.set("k", b, 5000)
	p, all := s.part("k", a, 1000)
	assert.Equal(t, 500.0, p)
	assert.Equal(t, 1000.0, all, "together they ask for more than the rate: the rate")
	assert.Equal(t, 2, s.count("k"))
	s.drop("k", b)
	p, all = s.part("k", a, 1000)
	assert.Equal(t, 1000.0, p, "one gone: the other may take the whole rate")
	assert.Equal(t, 1000.0, all)
	assert.Equal(t, 1, s.count("k"))
	s.set("k", a, 300)
	_, all = s.part("k", a, 1000)
	assert.Equal(t, 300.0, all, "what they ask for, when under the rate")
	s.drop("k", a)
	assert.Empty(t, s.by, "no ids left behind")
}
