package region

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/allot-dev/allot/algorithm"
	"github.com/allot-dev/allot/lua"
)

// Consumer is one RLQS client of a region bucket on this node, in tokens/s.
type Consumer struct {
	Offered float64 // its offered rate
	Held    float64 // the part it holds now (sent, still live)
	// Share is its fair share of what the bucket can give (a fraction in
	// [0, 1]), or -1 to keep what it holds (a stream that ended). The node
	// sends what is granted as soon as Settle returns.
	Share float64
}

// Settlement is one node's settlement of one region bucket's RLQS parts
// (lua/part.lua): Usage tokens its clients admitted since the last one
// are charged to the bucket (negative: refunded, for usage charged ahead
// of a report that showed less), and its consumers are published for TTL.
type Settlement struct {
	Key     string
	Spec    algorithm.Spec
	Node    string
	Usage   int64
	TTL     time.Duration
	Horizon time.Duration
	// Hysteresis: a consumer keeps what it holds while its fair part is
	// within this fraction of it.
	Hysteresis float64
	Consumers  []Consumer
}

// Settled is part.lua's answer for one bucket.
type Settled struct {
	// Avail is the rate (tokens/s) the bucket can give over the horizon:
	// what every consumer's parts split.
	Avail, Rate float64
	Burst       int64
	Tokens      int64 // after the charge; negative in debt
	// LeaseRate is the leases' use of the bucket (tokens/s) over the last
	// second or more; LeaseUnmet says they asked for more than they got.
	LeaseRate  float64
	LeaseUnmet bool
	// Parts are the parts granted to Settlement.Consumers, in order.
	Parts []float64
	// Others are the offered rates of every other node's live consumers.
	Others []float64
	Err    error
}

// PartsKey is the parts hash of a bucket key: same hash tag, so one
// script call reaches both.
func PartsKey(key string) string { return key + ":rlqs" }

// Settle runs part.lua once per settlement, all in one pipelined round
// trip. Settlements fail independently, each answer carrying its own
// error; the returned error is for arguments the caller got wrong.
func (s *Store) Settle(ctx context.Context, items []Settlement) ([]Settled, error) {
	keys := make([][]string, len(items))
	args := make([][]any, len(items))
	for i, it := range items {
		if err := checkSpec(it.Key, it.Spec); err != nil {
			return nil, fmt.Errorf("region: settle: %w", err)
		}
		if it.TTL < time.Millisecond || it.Horizon < time.Millisecond || it.Node == "" {
			return nil, fmt.Errorf("region: settle %q: usage %d, TTL %v, horizon %v, node %q", it.Key, it.Usage, it.TTL, it.Horizon, it.Node)
		}
		keys[i] = []string{it.Key, PartsKey(it.Key)}
		a := make([]any, 0, 8+3*len(it.Consumers))
		a = append(a, it.Spec.Limit, it.Spec.Period.Milliseconds(), it.Spec.Capacity(), it.Node, it.Usage,
			it.TTL.Milliseconds(), it.Horizon.Milliseconds(), ffmt(it.Hysteresis))
		for _, c := range it.Consumers {
			a = append(a, ffmt(c.Offered), ffmt(c.Held), ffmt(c.Share))
		}
		args[i] = a
	}
	replies := s.runArgs(ctx, lua.Part, keys, args)
	out := make([]Settled, len(items))
	for i, it := range items {
		r, err := parsePart(replies[i], len(it.Consumers))
		if err != nil {
			r = Settled{Err: fmt.Errorf("region: settle %s: %w", it.Key, err)}
		}
		out[i] = r
	}
	return out, nil
}

func ffmt(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func parsePart(r reply, n int) (Settled, error) {
	if r.err != nil {
		return Settled{}, r.err
	}
	vals, ok := r.val.([]any)
	if !ok {
		return Settled{}, fmt.Errorf("part.lua returned %T, not an array", r.val)
	}
	var err error
	if len(vals) < 6+n {
		return Settled{}, fmt.Errorf("part.lua returned %d values for %d consumers", len(vals), n)
	}
	num := func(v any) (float64, error) {
		switch x := v.(type) {
		case int64:
			return float64(x), nil
		case string:
			return strconv.ParseFloat(x, 64)
		}
		return 0, fmt.Errorf("part.lua: value %v is not a number", v)
	}
	f := make([]float64, len(vals))
	for i, v := range vals {
		if f[i], err = num(v); err != nil {
			return Settled{}, err
		}
	}
	return Settled{
		Avail: f[0], Rate: f[1], Burst: int64(f[2]), Tokens: int64(f[3]), LeaseRate: f[4], LeaseUnmet: f[5] != 0,
		Parts: f[6 : 6+n], Others: f[6+n:],
	}, nil
}
