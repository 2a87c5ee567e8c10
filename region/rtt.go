package region

import "time"

// rttKeep is how many of a shard's slowest recent round trips are kept.
const rttKeep = 8

// rttTail keeps a shard's slowest recent round trips, each halved for
// every rttHalfLife since it was seen, so that the stall threshold can
// follow the tail of healthy round trips without being set by one
// hiccup. A pause of this process (a GC, a descheduling) delays every
// pipeline in flight at once, so one such pause makes as many slow
// samples as there are pipelines: the threshold uses the (2P+1)-th
// slowest (P pipelines), which two pauses in a half-life do not reach,
// while a loaded machine, whose slow round trips come by the hundred,
// sets it as the slowest would. The zero value holds nothing. Pure: the
// caller passes the time and holds the shard's lock.
type rttTail struct {
	v  [rttKeep]time.Duration
	at [rttKeep]time.Time
}

func (t *rttTail) decayed(i int, now time.Time) time.Duration {
	v := t.v[i]
	if el := now.Sub(t.at[i]); el > 0 {
		v >>= min(int(el/rttHalfLife), 62)
	}
	return v
}

// observe records a round trip: it replaces the smallest kept one if it
// is larger.
func (t *rttTail) observe(now time.Time, rtt time.Duration) {
	lo, low := 0, t.decayed(0, now)
	for i := 1; i < rttKeep; i++ {
		if d := t.decayed(i, now); d < low {
			lo, low = i, d
		}
	}
	if rtt > low {
		t.v[lo], t.at[lo] = rtt, now
	}
}

// rank returns the rank-th slowest kept round trip (1: the slowest),
// decayed to now; 0 if fewer than rank were seen. rank is capped at
// rttKeep.
func (t *rttTail) rank(now time.Time, rank int) time.Duration {
	var d [rttKeep]time.Duration
	for i := range d {
		v := t.decayed(i, now)
		j := i
		for ; j > 0 && d[j-1] < v; j-- { // descending insertion sort
			d[j] = d[j-1]
		}
		d[j] = v
	}
	return d[min(max(rank, 1), rttKeep)-1]
}
