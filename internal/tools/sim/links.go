package sim

import (
	"time"
)

// The links between the simulated processes: a message's delay is the
// link's base latency plus its jitter (Config.Jitter); on the message
// transports (NATS: between regions, and a node's demand to its
// coordinator) it may also be dropped, duplicated or held back
// (Config.Loss), and between regions cut by a partition.

// jitter draws one message's extra delay on a link of jitter j.
func (s *Sim) jitter(j time.Duration) int64 {
	if j <= 0 {
		return 0
	}
	return s.frng.Int64N(int64(j))
}

// redisLegs are the two halves of a round trip of rtt to a Redis, each
// with its own jitter j: the request's way there and the reply's back.
func (s *Sim) redisLegs(j time.Duration) (there, back int64) {
	rtt := int64(s.cfg.RedisRTT)
	there = rtt / 2
	back = rtt - there
	return there + s.jitter(j), back + s.jitter(j)
}

// transmit delivers a message sent now, running deliver after base plus
// jitter j, as a lossy transport would: not at all, twice, or held back
// so that later messages overtake it. Each copy has its own delay.
func (s *Sim) transmit(base, j time.Duration, deliver func()) {
	s.transmitAt(s.now, base, j, deliver)
}

// transmitAt is transmit of a message that leaves at sent (>= now).
func (s *Sim) transmitAt(sent int64, base, j time.Duration, deliver func()) {
	l := &s.cfg.Loss
	if l.Drop > 0 && s.frng.Float64() < l.Drop {
		s.met.dropped++
		return
	}
	copies := 1
	if l.Dup > 0 && s.frng.Float64() < l.Dup {
		copies = 2
		s.met.duplicated++
	}
	for range copies {
		d := int64(base) + s.jitter(j)
		if l.Reorder > 0 && s.frng.Float64() < l.Reorder {
			d += s.frng.Int64N(int64(l.Hold))
			s.met.heldBack++
		}
		s.q.push(sent+d, deliver)
	}
}

// cut reports whether a partition stops a message from region a to
// region b now.
func (s *Sim) cut(a, b int) bool { return s.cutAt(a, b, s.now) }

// cutAt is cut at virtual time at.
func (s *Sim) cutAt(a, b int, at int64) bool {
	t := time.Duration(at)
	for i := range s.cfg.Partitions {
		p := &s.cfg.Partitions[i]
		if t >= p.From && t < p.To && p.cuts(a, b) {
			return true
		}
	}
	return false
}
