package sim

import "testing"

func TestQueueOrdersByTimeThenPush(t *testing.T) {
	var q queue
	var got []int
	for i, at := range []int64{5, 1, 5, 3, 1, 0} {
		q.push(at, func() { got = append(got, i) })
	}
	for q.len() > 0 {
		q.pop().fn()
	}
	want := []int{5, 1, 4, 3, 0, 2}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
}
