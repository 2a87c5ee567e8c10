package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Result is what a run measured. Its JSON is the last line of allot-sim's
// output; every field is a function of the Config alone.
type Result struct {
	Offered  int64 `json:"offered"`
	Admitted int64 `json:"admitted"`
	Ideal    int64 `json:"ideal"`
	// AdmittedOverIdeal is the whole run's admissions over an ideal
	// global bucket's, fed the same arrivals (every key is global).
	AdmittedOverIdeal float64 `json:"admitted_over_ideal"`
	// MaxOvershootOverBound is the worst window's admissions minus the
	// documented bound, over the bound (<= 0: the bound held), over every
	// window of every key: of each key's windows, the one whose
	// admissions exceed L.rate·T the most.
	MaxOvershootOverBound float64 `json:"max_overshoot_over_bound"`
	WorstWindow           string  `json:"worst_window"`
	// PastTTLAdmissions counts leased admissions that no grant its node
	// asked for within the last TTL covers: the bound's assumption 1
	// broken (0 in a correct fleet). Checked per node and key, oldest
	// grant first.
	PastTTLAdmissions int64 `json:"past_ttl_admissions"`
	// KeysChecked is the keys the bound was checked on (all of them),
	// KeysAdmitted those that admitted at least one request.
	KeysChecked  int `json:"keys_checked"`
	KeysAdmitted int `json:"keys_admitted"`
	// OutsideAdmissions counts admissions outside the bound's assumptions
	// (on_store_failure open or local, while a Redis was down), left out
	// of its check: OutsideOpen + OutsideLocal.
	OutsideAdmissions int64 `json:"outside_admissions"`
	OutsideOpen       int64 `json:"outside_open"`
	OutsideLocal      int64 `json:"outside_local"`
	// StoreFailureDecisions counts the requests decided by
	// on_store_failure (admitted or not).
	StoreFailureDecisions int64 `json:"store_failure_decisions"`
	// MaxOvershootWithOutside is MaxOvershootOverBound of every
	// admission, the outside ones included: what they cost against the
	// bound (the same figure when no Redis went down).
	MaxOvershootWithOutside float64 `json:"max_overshoot_with_outside"`
	WorstWindowWithOutside  string  `json:"worst_window_with_outside,omitempty"`
	// ConvergedAfterS is the seconds after the last shift (or the start)
	// until the hottest key's admissions stay >= 95 % of the ideal's in
	// every second (-1: never).
	ConvergedAfterS float64 `json:"converged_after_s"`
	// UnderservedRegionSeconds counts the (region, second) pairs served
	// below 95 % of their max-min fair part of the hottest key's ideal.
	UnderservedRegionSeconds int `json:"underserved_region_seconds"`
	// MaxShareSum is the largest sum of one key's shares in force, as a
	// fraction of L (Theorem 1: <= 1).
	MaxShareSum float64 `json:"max_share_sum"`
	LeaseCalls  int64   `json:"lease_calls"`
	// KeysLeased counts the keys some lease call asked for.
	KeysLeased int `json:"keys_leased"`
	// ExactCalls counts the checks of cold keys decided on the exact path.
	ExactCalls int64 `json:"exact_calls"`
	Epochs     int   `json:"epochs"`
	Stranded   int64 `json:"stranded"`
	LostWrites int   `json:"lost_writes"`
	Restarts   int   `json:"restarts"`
	// The transports' faults (Config.Loss): messages dropped, duplicated
	// and held back.
	MessagesDropped    int64 `json:"messages_dropped"`
	MessagesDuplicated int64 `json:"messages_duplicated"`
	MessagesHeldBack   int64 `json:"messages_held_back"`

	// Intervals is the hottest key's admissions around the shift (none
	// without one).
	Intervals []Interval     `json:"intervals,omitempty"`
	Regions   []RegionResult `json:"-"`
	// PerSecond is the hottest key's admissions (all regions) and the
	// ideal's, per second, for the plot.
	PerSecond []Point `json:"-"`
	cfg       Config
	hotRate   float64 // the hottest key's offered requests/s
}

// RegionResult is one region's totals and its hottest-key figures.
type RegionResult struct {
	Name                    string
	Offered, Admitted       int64
	HotOffered, HotAdmitted int64
}

// Interval is the hottest key's admissions over one stretch around the
// shift, as a fraction of L (the sandbox table).
type Interval struct {
	Name       string
	From, To   time.Duration
	OfL        float64   // all regions, admitted / (L · seconds)
	RegionsPer []float64 // per region, admitted/s
}

// intervalJSON is an Interval as the JSON line writes it: times in
// seconds.
type intervalJSON struct {
	Name      string    `json:"name"`
	From      float64   `json:"from_s"`
	To        float64   `json:"to_s"`
	OfL       float64   `json:"of_l"`
	PerRegion []float64 `json:"per_region_per_s"`
}

// MarshalJSON writes iv with its times in seconds.
func (iv Interval) MarshalJSON() ([]byte, error) {
	return json.Marshal(intervalJSON{iv.Name, iv.From.Seconds(), iv.To.Seconds(), iv.OfL, iv.RegionsPer})
}

// UnmarshalJSON reads what MarshalJSON writes (for readers of the JSON
// line, as the docs generator).
func (iv *Interval) UnmarshalJSON(b []byte) error {
	var j intervalJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*iv = Interval{Name: j.Name, From: time.Duration(j.From * float64(time.Second)), To: time.Duration(j.To * float64(time.Second)), OfL: j.OfL, RegionsPer: j.PerRegion}
	return nil
}

// Point is one second of the hottest key: admitted in all regions and in
// each, and by the ideal bucket.
type Point struct {
	Admitted, Ideal int64
	Regions         []int64
}

func (s *Sim) result() *Result {
	m := s.met
	c := s.cfg
	res := &Result{cfg: c, hotRate: c.Rate * s.dist.weight(0), LeaseCalls: m.leaseCalls, KeysLeased: m.keysLeased, ExactCalls: m.exactCalls, Stranded: s.stranded, LostWrites: s.undone, MaxShareSum: round(m.maxShares, 6)}
	secs := int(c.Duration / time.Second)
	for i := range m.offered {
		res.Offered += m.offered[i]
		res.Admitted += m.admitted[i]
		res.Ideal += m.ideal[i]
	}
	if res.Ideal > 0 {
		res.AdmittedOverIdeal = round(float64(res.Admitted)/float64(res.Ideal), 6)
	}
	res.MaxOvershootOverBound, res.WorstWindow = round(m.bound.worst, 6), m.bound.where
	res.KeysChecked, res.KeysAdmitted = len(m.bound.x), m.bound.admitted
	res.PastTTLAdmissions = m.pastTTL
	res.OutsideOpen, res.OutsideLocal, res.StoreFailureDecisions = m.outsideOpen, m.outsideLocal, m.storeFailed
	res.OutsideAdmissions = m.outsideOpen + m.outsideLocal
	res.MaxOvershootWithOutside = res.MaxOvershootOverBound
	if w := m.withOutside; w != nil {
		res.MaxOvershootWithOutside, res.WorstWindowWithOutside = round(w.worst, 6), w.where
	}
	res.Restarts = s.restarts
	res.MessagesDropped, res.MessagesDuplicated, res.MessagesHeldBack = m.dropped, m.duplicated, m.heldBack
	res.ConvergedAfterS = m.converged(c.lastChange(), c.Duration)
	res.UnderservedRegionSeconds = m.underserved(c.Duration)
	for _, reg := range s.regions {
		for _, co := range reg.all {
			res.Epochs += co.epochs
		}
		rr := RegionResult{Name: reg.name}
		for i := range m.offered {
			rr.HotOffered += m.hotOffered[reg.idx][i]
			rr.HotAdmitted += m.hotAdmitted[reg.idx][i]
		}
		res.Regions = append(res.Regions, rr)
	}
	for i := range secs {
		p := Point{Admitted: m.hotTotal(i), Ideal: m.hotIdeal[i]}
		for r := range m.hotAdmitted {
			p.Regions = append(p.Regions, m.hotAdmitted[r][i])
		}
		res.PerSecond = append(res.PerSecond, p)
	}
	if c.ShiftAt > 0 {
		sh, iv := c.ShiftAt.Truncate(time.Second), c.Interval
		for _, p := range []struct {
			name     string
			from, to time.Duration
		}{
			{"before the shift", sh - iv, sh},
			{"1st interval after", sh, sh + iv},
			{"2nd interval", sh + iv, sh + 2*iv},
			{"after 2 intervals", sh + 2*iv, c.Duration.Truncate(time.Second)},
		} {
			if p.from < 0 || p.to <= p.from || p.to > c.Duration {
				continue
			}
			res.Intervals = append(res.Intervals, s.interval(p.name, p.from, p.to))
		}
	}
	return res
}

func (s *Sim) interval(name string, from, to time.Duration) Interval {
	m := s.met
	iv := Interval{Name: name, From: from, To: to}
	d := (to - from).Seconds()
	var all int64
	for _, reg := range s.regions {
		var n int64
		for i := int(from / time.Second); i < int(to/time.Second); i++ {
			n += m.hotAdmitted[reg.idx][i]
		}
		all += n
		iv.RegionsPer = append(iv.RegionsPer, round(float64(n)/d, 1))
	}
	iv.OfL = round(float64(all)/d/m.rate, 4)
	return iv
}

func round(x float64, digits int) float64 {
	if math.IsInf(x, 0) || math.IsNaN(x) {
		return 0
	}
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// Write prints the summary table and, last, the JSON line.
func (r *Result) Write(w io.Writer) error {
	c := r.cfg
	var b strings.Builder
	fmt.Fprintf(&b, "allot-sim: %d regions x %d nodes, %d keys (%s), %.0f req/s offered, L %d/s burst %d, interval %v, ttl %v, seed %d, %v\n",
		c.Regions, c.Nodes, c.Keys, c.Dist, c.Rate, c.Limit, c.Burst, c.Interval, c.TTL, c.Seed, c.Duration)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "region\thot offered/s\thot admitted/s\t")
	secs := c.Duration.Seconds()
	for _, rr := range r.Regions {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t\n", rr.Name, float64(rr.HotOffered)/secs, float64(rr.HotAdmitted)/secs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(&b, "all keys: offered %d, admitted %d, ideal bucket %d (%.2f %%); lease calls %d; exact checks %d; epochs %d\n",
		r.Offered, r.Admitted, r.Ideal, 100*r.AdmittedOverIdeal, r.LeaseCalls, r.ExactCalls, r.Epochs)
	fmt.Fprintf(&b, "worst window: %s (%.1f %% of the bound)\n", r.WorstWindow, 100*(1+r.MaxOvershootOverBound))
	if r.StoreFailureDecisions > 0 {
		fmt.Fprintf(&b, "on_store_failure %s: %d requests decided, %d admitted open and %d local (outside the bound); with them the worst window is %.1f %% of the bound\n",
			cmp.Or(c.OnStoreFailure, FailOpen), r.StoreFailureDecisions, r.OutsideOpen, r.OutsideLocal, 100*(1+r.MaxOvershootWithOutside))
	}
	if len(r.Intervals) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "hot key, by interval\tfrom\tto\t% of L\tper region /s\t")
		for _, iv := range r.Intervals {
			fmt.Fprintf(tw, "%s\t%v\t%v\t%.1f\t%v\t\n", iv.Name, iv.From, iv.To, 100*iv.OfL, iv.RegionsPer)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	js, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b.Write(js)
	b.WriteByte('\n')
	_, err = io.WriteString(w, b.String())
	return err
}
