package sim

// queue is the simulation's only scheduler: events ordered by virtual time
// (nanoseconds since the start) and, at the same instant, by the order
// they were pushed. Nothing else decides what runs next, so a run is a
// function of its configuration and seed.
type queue struct {
	h   []event
	seq uint64
}

type event struct {
	at  int64
	seq uint64
	fn  func()
}

func (e *event) before(o *event) bool {
	return e.at < o.at || e.at == o.at && e.seq < o.seq
}

func (q *queue) push(at int64, fn func()) {
	q.seq++
	q.h = append(q.h, event{at: at, seq: q.seq, fn: fn})
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.h[i].before(&q.h[p]) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

func (q *queue) len() int { return len(q.h) }

// peek is the time of the earliest event; the queue must not be empty.
func (q *queue) peek() int64 { return q.h[0].at }

func (q *queue) pop() event {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h[n] = event{}
	q.h = q.h[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && q.h[l].before(&q.h[m]) {
			m = l
		}
		if r < n && q.h[r].before(&q.h[m]) {
			m = r
		}
		if m == i {
			return top
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
}
