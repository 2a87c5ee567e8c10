package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// sections are the doc's generated regions, in the doc's order.
var sections = []section{
	{name: "output", make: (*gen).output},
	{name: "fault-flags", make: (*gen).faultFlags},
	{name: "overlap", make: (*gen).overlap},
	{name: "faults", make: (*gen).faults},
	{name: "mutants", make: (*gen).mutants},
	{name: "acceptance", make: (*gen).acceptance},
	{name: "speed", optIn: "big", make: (*gen).speed},
	{name: "sandbox", optIn: "sandbox", make: (*gen).sandbox},
	{name: "after-shift", make: (*gen).afterShift},
	{name: "accuracy", make: (*gen).accuracy},
}

// shiftTo is the weights of a shift sending 90 % of the traffic to
// region 0 and the rest evenly to the others (weights need not sum to 1).
func shiftTo(regions int) string {
	switch regions {
	case 3:
		return "0.9,0.05,0.05"
	case 5:
		return "0.9,0.025,0.025,0.025,0.025"
	}
	w := []string{strconv.Itoa(9 * (regions - 1))}
	for range regions - 1 {
		w = append(w, "1")
	}
	return strings.Join(w, ",")
}

// shiftBase is the sandbox's scenario: one key, L = 300/s, 1,500/s
// offered, 90 % of it to us from 30 s.
func shiftBase(nodes string, duration string) []string {
	return []string{"--regions", "3", "--nodes", nodes, "--keys", "1", "--dist", "hot", "--rate", "1500", "--limit", "300",
		"--duration", duration, "--shift-at", "30s", "--shift-to", shiftTo(3)}
}

func seeds(base []string, flags []string, n int) [][]string {
	var out [][]string
	for s := 1; s <= n; s++ {
		out = append(out, slices.Concat(base, flags, []string{"--seed", strconv.Itoa(s)}))
	}
	return out
}

// The 3-region shift under each fault flag.
var (
	faultBase = append(shiftBase("8", "70s"), "--phase", "0s")
	allFaults = []string{"--jitter", "node=1ms,coord=2ms,region=40ms", "--loss", "drop=0.05,dup=0.02,reorder=0.1",
		"--partition", "1>0@25s-45s", "--skew", "redis=200ms,node=50ms,coord=1s", "--redis-outage", "0@35s-40s",
		"--on-store-failure", "local", "--restart", "0/1@33s-38s,0/2@34s-40s", "--join", "0@35s,1@36s", "--coord-overlap", "0@30s-45s"}
	faultRows = [][]string{
		nil,
		{"--jitter", "node=1ms,coord=2ms,region=40ms"},
		{"--loss", "drop=0.05,dup=0.02,reorder=0.1"},
		{"--partition", "1>0@32s-38s"},
		{"--partition", "1<>2@32s-38s"},
		{"--partition", "*>0@32s-38s"},
		{"--partition", "1>0@25s-45s"},
		{"--partition", "1<>2@25s-45s"},
		{"--skew", "redis=200ms,node=50ms,coord=1s"},
		{"--redis-outage", "0@35s-40s", "--on-store-failure", "open"},
		{"--redis-outage", "0@35s-40s", "--on-store-failure", "closed"},
		{"--redis-outage", "0@35s-40s", "--on-store-failure", "local"},
		{"--restart", "0/1@33s-38s,0/2@34s-40s", "--join", "0@35s,1@36s"},
		{"--coord-overlap", "0@30s-45s"},
		allFaults,
	}
)

// faultSeeds is how many seeds each fault row runs: enough that one
// seed's lucky draw of lost messages or measurement noise cannot pass
// for the row's figure.
const faultSeeds = 20

func (g *gen) faults() (string, error) {
	var runs [][]string
	for _, f := range faultRows {
		runs = append(runs, seeds(faultBase, f, faultSeeds)...)
	}
	rs, err := g.sims(runs)
	if err != nil {
		return "", err
	}
	t := table{head: []string{"fault flags", "1st", "2nd", "2nd >= 95 %", "later", "`max_overshoot_over_bound`", "`max_overshoot_with_outside`", "`max_share_sum`"}}
	for i, f := range faultRows {
		r := rs[faultSeeds*i : faultSeeds*(i+1)]
		name := cmdCell(f)
		if slices.Equal(f, allFaults) {
			name = "`$ALL`"
		}
		of := func(f func(*result) float64) []float64 {
			xs := make([]float64, len(r))
			for i, r := range r {
				xs[i] = f(r)
			}
			return xs
		}
		second := of(func(r *result) float64 { return r.iv(2) })
		t.add(name,
			span(of(func(r *result) float64 { return r.iv(1) }), 1),
			minMedMax(second),
			under95(second),
			span(of(func(r *result) float64 { return r.iv(3) }), 1),
			num(slices.Max(of(func(r *result) float64 { return r.MaxOvershootOverBound })), 3),
			num(slices.Max(of(func(r *result) float64 { return r.MaxOvershootWithOutside })), 3),
			num(slices.Max(of(func(r *result) float64 { return r.MaxShareSum })), 3))
	}
	return g.header("") + sh(
		fmt.Sprintf("# each row: its fault flags (FLAGS), seeds 1 to %d; the last row's are", faultSeeds),
		`ALL="`+strings.Join(allFaults, " ")+`"`,
		fmt.Sprintf("for seed in $(seq 1 %d); do", faultSeeds),
		"  "+simLine(faultBase)+" FLAGS --seed $seed",
		"done") + t.String(), nil
}

// minMedMax is "min / median / max" of xs (a % of L), one decimal.
func minMedMax(xs []float64) string {
	s := slices.Sorted(slices.Values(xs))
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return num(s[0], 1) + " / " + num(med, 1) + " / " + num(s[len(s)-1], 1)
}

// under95 is how many of xs (a % of L, one per seed, seed 1 first) reach
// 95, and the seeds that do not when they are few.
func under95(xs []float64) string {
	var below []string
	for i, x := range xs {
		if x < 95 {
			below = append(below, fmt.Sprintf("%d (%s)", i+1, num(x, 1)))
		}
	}
	out := fmt.Sprintf("%d of %d", len(xs)-len(below), len(xs))
	if len(below) > 0 && len(below) <= 3 {
		out += "; not seed " + strings.Join(below, ", ")
	}
	return out
}

// output's rows: the JSON line's fields, what each means. Every field
// allot-sim prints must be in one row (the generator fails otherwise).
var outputRows = []struct {
	fields  []string
	meaning string
}{
	{[]string{"offered", "admitted", "ideal"}, "requests offered, admitted, and admitted by one ideal global bucket per key fed the same arrivals (all keys, whole run)"},
	{[]string{"admitted_over_ideal"}, "admitted / ideal"},
	{[]string{"max_overshoot_over_bound", "worst_window"}, "over every key and every window, (admitted − bound)/bound of the window that exceeds `L.rate·T` the most, bound = `L.burst + L.rate·(T + TTL + 1 ms)` (ARCHITECTURE.md, Theorem 2), and that window. <= 0: the bound held. As the bound is linear in `T`, one running value per key checks all its windows: `x ← max(x − L.rate·dt, 0) + cost` at each admission, a violation when `x > L.burst + L.rate·(TTL + 1 ms)` (24 bytes a key)"},
	{[]string{"past_ttl_admissions"}, "leased admissions that no grant of their node's last `TTL` covers: the overshoot bound's assumption 1 broken (ARCHITECTURE.md, \"The overshoot bound\"); 0 in a correct fleet. Per node and key the grants its lease calls brought are kept oldest first, each spendable until its call's sending plus `TTL` + 1 ms, and each leased admission is counted against the oldest live one, as the manager spends them"},
	{[]string{"keys_checked", "keys_admitted"}, "keys the bound was checked on (every key), and those that admitted anything"},
	{[]string{"outside_admissions", "outside_open", "outside_local"}, "admissions outside the bound's assumptions (`on_store_failure` open or local while a `--redis-outage` lasts), left out of the check, in all and by mode"},
	{[]string{"store_failure_decisions"}, "requests decided by `on_store_failure` (admitted or not)"},
	{[]string{"max_overshoot_with_outside", "worst_window_with_outside"}, "the same check over every admission, the outside ones included: what they cost against the bound (equal to `max_overshoot_over_bound` without outages; the window only with one)"},
	{[]string{"converged_after_s"}, "after the last shift (or the start), seconds until the hottest key's admissions, over 6-second trailing windows, stay >= 95 % of the ideal's to the end; −1: never"},
	{[]string{"underserved_region_seconds"}, "(region, second) pairs in which a region got < 95 % of its max-min fair part of the ideal's admissions of the hottest key (6-second trailing sums; a region asking less than an even part is owed all it asked)"},
	{[]string{"max_share_sum"}, "the largest sum over the regions of the rate one key's buckets enforce (a written share's, else the node's policy numbers), / L (Theorem 1: <= 1)"},
	{[]string{"lease_calls", "keys_leased", "exact_calls"}, "lease round trips, the keys some lease call asked for, and the checks of cold keys decided on the exact path (`check_tb.lua`)"},
	{[]string{"epochs", "stranded", "lost_writes"}, "finished coordinator epochs, tokens dropped by crashed nodes, writes lost by failovers"},
	{[]string{"restarts", "messages_dropped", "messages_duplicated", "messages_held_back"}, "nodes restarted; the transports' faults (`--loss`)"},
	{[]string{"intervals"}, "with a shift, the hottest key's admissions over the interval before it, the 1st and 2nd after it and from then to the end: `name`, `from_s`, `to_s`, `of_l` (admitted / (L · seconds)), `per_region_per_s`"},
}

func (g *gen) output() (string, error) {
	args := seeds(faultBase, allFaults, 1)[0]
	r, err := g.sim(args)
	if err != nil {
		return "", err
	}
	values := map[string]json.RawMessage{}
	for _, f := range r.fields {
		values[f.name] = f.value
	}
	t := table{head: []string{"field", "meaning", "in this run"}}
	listed := map[string]bool{}
	for _, row := range outputRows {
		var names, vals []string
		for _, f := range row.fields {
			listed[f] = true
			names = append(names, "`"+f+"`")
			v, ok := values[f]
			switch {
			case !ok:
				vals = append(vals, "—")
			case f == "intervals":
				for _, iv := range r.Intervals {
					vals = append(vals, fmt.Sprintf("%s %s %%", iv.Name, pct(iv.OfL)))
				}
			default:
				vals = append(vals, strings.Trim(string(v), `"`))
			}
		}
		t.add(strings.Join(names, ", "), row.meaning, strings.Join(vals, "; "))
	}
	for _, f := range r.fields {
		if !listed[f.name] {
			return "", fmt.Errorf("allot-sim prints %q, which outputRows does not describe", f.name)
		}
	}
	return g.header("") + sh(simLine(args)) + t.String(), nil
}

// faultFlags' rows: each flag, its examples (each one run) and what it
// does.
var flagRows = []struct {
	flag     string
	examples [][2]string // an example, and what it means ("" : nothing to add)
	more     string      // after the examples
	does     string
}{
	{"--jitter", [][2]string{{"5ms", "every link"}, {"node=1ms,coord=2ms,region=40ms", ""}}, "",
		"each message's one-way delay gets an extra uniform `[0, d)`: node <-> Redis (lease calls, exact checks, and a node's demand to its coordinator), coordinator <-> Redis (share reads and writes, the lock), region <-> region; it reorders messages too"},
	{"--loss", [][2]string{{"0.05", "drop only"}, {"drop=0.05,dup=0.02,reorder=0.1,hold=100ms", ""}}, "",
		"on the NATS transports (coordinator messages between regions, a node's demand to its coordinator) each message is dropped, else duplicated, and (each copy) held back uniform `[0, hold)` with those probabilities"},
	{"--partition", [][2]string{{"1@60s-90s", "region 1, all links, both ways"}, {"1<>2@60s-90s", "one link, both ways"}, {"1>2@60s-90s", "only 1's messages to 2"},
		{"1>*@60s-90s", "what leaves 1"}, {"*>1@60s-90s", "what reaches 1"}}, "; a comma-separated list",
		"cuts coordinator messages, checked when sent and when they arrive"},
	{"--skew", [][2]string{{"50ms", "every clock"}, {"redis=200ms,node=50ms,coord=1s", ""}}, "",
		"constant clock offsets drawn from `[-d, d]`: per region's Redis (its `TIME` and the clock its keys expire by), per node (its `lease.Clock` and local fallback), per region's coordinators (the wall clock epochs are aligned on)"},
	{"--redis-outage", [][2]string{{"0@35s-40s", ""}}, "",
		"the region's Redis is unreachable: every call (lease, exact check, share read and write, the coordinator's lock) fails a round trip after it is sent; its data is kept. Requests that need it are decided by `--on-store-failure`"},
	{"--on-store-failure", [][2]string{{"open", "the default"}, {"closed", ""}, {"local", ""}}, " (run here with `--redis-outage 0@35s-40s`)",
		"every policy's `on_store_failure`, as package `decide` applies it: closed denies, open admits, local takes from the node's `fallback.Store` (the region's numbers over its live nodes). Open and local admissions are counted apart (`outside_open`, `outside_local`) and in the second check only (`max_overshoot_with_outside`)"},
	{"--restart", [][2]string{{"0/3@40s-55s", ""}}, "",
		"the node crashes (as `--crash`) and comes back at the second time as a new process (an empty lease manager)"},
	{"--join", [][2]string{{"2@45s", "one node per item"}}, "",
		"a node joins the region and takes its part of the traffic"},
	{"--away", [][2]string{{"450ms/2s@30s", "from 30 s to the end"}, {"450ms/2s@30s-60s", ""}, {"450ms/2s", ""}}, "",
		"load, not a fault: each node of every region gets none of the region's requests for the first time, once every second time, the nodes' turns spread over it; its requests go to the next live node of the region not away (none: not offered). A node that leased keeps its grant meanwhile, expired if its traffic comes back between one and two `TTL`s later"},
	{"--coord-overlap", [][2]string{{"0@35s-50s", ""}}, "",
		"the region's coordinator loses its lock at the first time without noticing until the second (the lock's key is gone, and its renewals answer that it holds it whatever the key holds, unless the region's Redis is down); a new coordinator starts then, takes the lock with `lock_hold.lua` at its first `Hold` (within 1.7 s) and, after its listening epoch, acts: until the second time both drain demand, report, hear the others and write shares; then the old one's next `Hold` finds the lock taken and it stands by"},
}

// flagBase is the run each fault flag's examples are added to: 3
// regions of 4 nodes, 100 Zipf keys (the hottest leased), a shift.
var flagBase = []string{"--regions", "3", "--nodes", "4", "--keys", "100", "--dist", "zipf", "--rate", "3000", "--duration", "2m",
	"--shift-at", "30s", "--shift-to", shiftTo(3)}

func (g *gen) faultFlags() (string, error) {
	var runs [][]string
	var flags [][]string
	for _, row := range flagRows {
		for _, ex := range row.examples {
			f := []string{row.flag, ex[0]}
			if row.flag == "--on-store-failure" {
				f = append([]string{"--redis-outage", "0@35s-40s"}, f...)
			}
			flags = append(flags, f)
			runs = append(runs, slices.Concat(flagBase, f))
		}
	}
	runs = append(runs, flagBase)
	rs, err := g.sims(runs)
	if err != nil {
		return "", err
	}
	desc := table{head: []string{"flag", "syntax, example", "what it does"}}
	for _, row := range flagRows {
		var exs []string
		for _, ex := range row.examples {
			s := "`" + ex[0] + "`"
			if ex[1] != "" {
				s += " (" + ex[1] + ")"
			}
			exs = append(exs, s)
		}
		desc.add("`"+row.flag+"`", strings.Join(exs, ", ")+row.more, row.does)
	}
	base := rs[len(rs)-1]
	t := table{head: []string{"FLAGS", "`admitted_over_ideal`", "2nd interval, % of L", "`max_overshoot_over_bound`", "what else moved"}}
	t.add("none", num(base.AdmittedOverIdeal, 4), num(base.iv(2), 1), num(base.MaxOvershootOverBound, 4), "—")
	for i, f := range flags {
		r := rs[i]
		t.add(cmdCell(f), num(r.AdmittedOverIdeal, 4), num(r.iv(2), 1), num(r.MaxOvershootOverBound, 4), moved(r, base))
	}
	return g.header("") + sh(
		"# each example of the first table, as the second's FLAGS",
		simLine(flagBase)+" FLAGS") + desc.String() + "\n" + t.String(), nil
}

// moved lists the fault counters of r that differ from base's.
func moved(r, base *result) string {
	var out []string
	add := func(name string, a, b float64, decimals int) {
		if a != b {
			out = append(out, fmt.Sprintf("`%s` %s", name, num(a, decimals)))
		}
	}
	add("store_failure_decisions", float64(r.StoreFailureDecisions), float64(base.StoreFailureDecisions), 0)
	add("outside_open", float64(r.OutsideOpen), float64(base.OutsideOpen), 0)
	add("outside_local", float64(r.OutsideLocal), float64(base.OutsideLocal), 0)
	add("max_overshoot_with_outside", r.MaxOvershootWithOutside, r.MaxOvershootOverBound, 4)
	add("restarts", float64(r.Restarts), float64(base.Restarts), 0)
	add("stranded", float64(r.Stranded), float64(base.Stranded), 0)
	add("messages_dropped", float64(r.MessagesDropped), float64(base.MessagesDropped), 0)
	add("messages_duplicated", float64(r.MessagesDuplicated), float64(base.MessagesDuplicated), 0)
	add("messages_held_back", float64(r.MessagesHeldBack), float64(base.MessagesHeldBack), 0)
	add("max_share_sum", r.MaxShareSum, base.MaxShareSum, 4)
	add("past_ttl_admissions", float64(r.PastTTLAdmissions), float64(base.PastTTLAdmissions), 0)
	if len(out) == 0 {
		return "—"
	}
	return strings.Join(out, ", ")
}

// The property test's scenarios: go test's 40 and -sim.long's 200 from
// seeds 1, 201 and 401.
var (
	propertyFirsts = []int{1, 201, 401}
	overlapLine    = regexp.MustCompile(`coordinator overlap in region (\d+) (\S+)-(\S+): max_share_sum ([0-9.]+), max_overshoot_over_bound (-?[0-9.]+), worst window (.*)$`)
)

func propertyArgs(first int) []string {
	return []string{"./internal/tools/sim", "-run", "^TestPropertyBound$", "-count=1", "-sim.long", "-sim.first", strconv.Itoa(first)}
}

type overlapRun struct {
	seed                 int
	region               string
	from, to             time.Duration
	shares, overshoot    float64
	window               string
	defaultSet, pastL, w bool
}

func (g *gen) overlap() (string, error) {
	var runs []overlapRun
	total := 0
	for _, first := range propertyFirsts {
		_, outputs, outcomes, err := g.goTest(propertyArgs(first)...)
		if err != nil {
			return "", err
		}
		for name, outcome := range outcomes {
			seed, ok := strings.CutPrefix(name, "TestPropertyBound/")
			if !ok || outcome != "pass" {
				continue
			}
			total++
			n, _ := strconv.Atoi(seed)
			for _, l := range outputs[name] {
				m := overlapLine.FindStringSubmatch(l)
				if m == nil {
					continue
				}
				o := overlapRun{seed: n, region: m[1], window: m[6], defaultSet: n <= 40}
				o.from, _ = time.ParseDuration(m[2])
				o.to, _ = time.ParseDuration(m[3])
				o.shares, _ = strconv.ParseFloat(m[4], 64)
				o.overshoot, _ = strconv.ParseFloat(m[5], 64)
				o.pastL, o.w = o.shares > 1, o.overshoot > 0
				runs = append(runs, o)
			}
		}
	}
	if total != 200*len(propertyFirsts) {
		return "", fmt.Errorf("%d property scenarios passed, want %d", total, 200*len(propertyFirsts))
	}
	slices.SortFunc(runs, func(a, b overlapRun) int { return a.seed - b.seed })
	summary := table{head: []string{"seeds", "scenarios", "with an overlap", "shares past L", "a window past the bound"}}
	tally := func(name string, scenarios int, keep func(overlapRun) bool) {
		var n, past, win int
		for _, o := range runs {
			if keep(o) {
				n++
				if o.pastL {
					past++
				}
				if o.w {
					win++
				}
			}
		}
		summary.add(name, strconv.Itoa(scenarios), strconv.Itoa(n), strconv.Itoa(past), strconv.Itoa(win))
	}
	tally("1-40 (`go test`)", 40, func(o overlapRun) bool { return o.defaultSet })
	tally(fmt.Sprintf("1-%d", total), total, func(overlapRun) bool { return true })
	detail := table{head: []string{"seed", "overlap", "`max_share_sum`", "`max_overshoot_over_bound`", "worst window"}}
	var repro string
	for _, o := range runs {
		if !o.pastL && !o.w {
			continue
		}
		detail.add(strconv.Itoa(o.seed), fmt.Sprintf("region %s, %s-%s s", o.region, num(o.from.Seconds(), 1), num(o.to.Seconds(), 1)),
			num(o.shares, 4), num(o.overshoot, 4), o.window)
		if repro == "" {
			first := 1 + (o.seed-1)/200*200
			repro = fmt.Sprintf("go test ./internal/tools/sim -run 'TestPropertyBound/^%d$' -v", o.seed)
			if o.seed > 40 {
				repro = fmt.Sprintf("go test ./internal/tools/sim -sim.long -sim.first %d -run 'TestPropertyBound/^%d$' -v", first, o.seed)
			}
		}
	}
	var lines []string
	for _, first := range propertyFirsts {
		lines = append(lines, "go test -json "+shellJoin(propertyArgs(first)))
	}
	body := g.header("") + sh(lines...) + summary.String()
	if len(detail.rows) > 0 {
		body += "\nThe scenarios whose shares went past L or whose window broke the bound:\n\n" + detail.String() +
			"\nReproduce the first: `" + repro + "`.\n"
	}
	return body, nil
}

var caughtLine = regexp.MustCompile(`\.go:\d+: (.+?): caught in (\d+) of 12 \(a window past the bound in (\d+), shares past L in (\d+), past-TTL admissions in (\d+): (\d+)-(\d+)\)`)

func (g *gen) mutants() (string, error) {
	args := []string{"./internal/tools/sim", "-run", "^TestMutantsAreCaught$", "-count=1", "-v"}
	tests, outputs, outcomes, err := g.goTest(args...)
	if err != nil {
		return "", err
	}
	var names []string
	for _, name := range tests {
		if sub, ok := strings.CutPrefix(name, "TestMutantsAreCaught/"); ok && outcomes[name] == "pass" {
			names = append(names, sub)
		}
	}
	if len(names) == 0 {
		return "", fmt.Errorf("no mutant ran")
	}
	t := table{head: []string{"mutant", "caught in", "a window past the bound in", "shares past L in", "past-TTL admissions in"}}
	for _, n := range names {
		var m []string
		for _, l := range outputs["TestMutantsAreCaught/"+n] {
			if m = caughtLine.FindStringSubmatch(l); m != nil {
				break
			}
		}
		if m == nil {
			return "", fmt.Errorf("mutant %s logged no \"caught in\" line", n)
		}
		past := m[5]
		if m[5] != "0" {
			past += fmt.Sprintf(" (%s-%s such admissions)", m[6], m[7])
		}
		t.add(m[1], m[2]+" of 12", m[3], m[4], past)
	}
	return g.header("") + sh("go test -json "+shellJoin(args)) + t.String(), nil
}

// The acceptance scenario: 3 regions of 32 nodes, 10^5 Zipf keys, at a
// rate at which the hottest keys lease.
var acceptanceArgs = []string{"--regions", "3", "--nodes", "32", "--keys", "100000", "--dist", "zipf", "--rate", "30000", "--duration", "10m", "--seed", "7"}

// AcceptanceCommand is the acceptance scenario as README.md shows it.
func acceptanceCommand() string { return "go run ./cmd/allot-sim " + shellJoin(acceptanceArgs) }

func (g *gen) acceptance() (string, error) {
	load := loadavg()
	r, err := g.sim(acceptanceArgs)
	if err != nil {
		return "", err
	}
	leased := r.Offered - r.ExactCalls - r.StoreFailureDecisions
	t := table{head: []string{"figure", "value"}}
	t.add("requests offered, admitted; `admitted_over_ideal`", fmt.Sprintf("%s, %s; %s", count(r.Offered), count(r.Admitted), num(r.AdmittedOverIdeal, -1)))
	t.add("`lease_calls`", count(r.LeaseCalls))
	t.add("`keys_leased`", fmt.Sprintf("%s of %s", count(r.KeysLeased), count(r.KeysChecked)))
	t.add("`exact_calls`", fmt.Sprintf("%s (%s %% of the requests)", count(r.ExactCalls), pct(float64(r.ExactCalls)/float64(r.Offered))))
	t.add("requests decided from leases", fmt.Sprintf("%s (%s %%)", count(leased), pct(float64(leased)/float64(r.Offered))))
	t.add("`keys_checked`, `keys_admitted`", count(r.KeysChecked)+", "+count(r.KeysAdmitted))
	t.add("`max_overshoot_over_bound`", fmt.Sprintf("%s (%s)", num(r.MaxOvershootOverBound, 4), r.WorstWindow))
	t.add("`past_ttl_admissions`, `max_share_sum`", fmt.Sprintf("%d, %s", r.PastTTLAdmissions, num(r.MaxShareSum, 4)))
	t.add("`epochs`", count(r.Epochs))
	t.add("wall time, user CPU, peak RSS", fmt.Sprintf("%s, %s, %s (load average %s before the run)", dur(r.wall), dur(r.user), bytesGB(r.maxRSS), load))
	return g.header("") + sh(simLine(acceptanceArgs)) + t.String(), nil
}

// loadavg is the machine's 1-minute load average.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(b))[0]
}

// The speed run: issue 44's scale, every fault flag.
var speedArgs = []string{"--regions", "10", "--nodes", "64", "--keys", "1000000", "--dist", "zipf", "--rate", "100000", "--duration", "5m",
	"--jitter", "node=1ms,coord=2ms,region=20ms", "--loss", "drop=0.02,dup=0.01,reorder=0.05",
	"--partition", "1>2@60s-90s,3<>4@100s-120s", "--skew", "redis=100ms,node=20ms,coord=500ms",
	"--redis-outage", "5@120s-130s", "--on-store-failure", "local", "--restart", "0/1@100s-110s", "--join", "2@150s",
	"--coord-overlap", "6@200s-215s"}

func (g *gen) speed() (string, error) {
	load := loadavg()
	r, err := g.sim(speedArgs)
	if err != nil {
		return "", err
	}
	t := table{head: []string{"figure", "value"}}
	t.add("wall time, user CPU, peak RSS", fmt.Sprintf("**%s**, %s, **%s** (load average %s before the run)", dur(r.wall), dur(r.user), bytesGB(r.maxRSS), load))
	t.add("`keys_checked`, `keys_admitted`", count(r.KeysChecked)+", "+count(r.KeysAdmitted))
	t.add("`max_overshoot_over_bound`", fmt.Sprintf("%s (%s)", num(r.MaxOvershootOverBound, 4), r.WorstWindow))
	t.add("`past_ttl_admissions`, `max_share_sum`", fmt.Sprintf("%d, %s", r.PastTTLAdmissions, num(r.MaxShareSum, 4)))
	t.add("`store_failure_decisions`, `outside_local`", count(r.StoreFailureDecisions)+", "+count(r.OutsideLocal))
	t.add("`max_overshoot_with_outside`", num(r.MaxOvershootWithOutside, 4))
	t.add("`admitted_over_ideal`", num(r.AdmittedOverIdeal, -1))
	t.add("`lease_calls`, `keys_leased`, `exact_calls`", count(r.LeaseCalls)+", "+count(r.KeysLeased)+", "+count(r.ExactCalls))
	t.add("`messages_dropped`, `_duplicated`, `_held_back`", count(r.MessagesDropped)+", "+count(r.MessagesDuplicated)+", "+count(r.MessagesHeldBack))
	return g.header("big") + sh(simLine(speedArgs)) + t.String(), nil
}

// After a shift: the 2nd and 3rd intervals over phases 0-9 s and seeds
// 1-3, at L = 300/s and 3000/s.
var afterRows = []struct {
	name  string
	nodes []string
}{
	{"2, all traffic to node 0", []string{"2", "--hot-node"}},
	{"2", []string{"2"}},
	{"8", []string{"8"}},
	{"32", []string{"32"}},
}

func afterArgs(nodes []string, limit, phase, seed int) []string {
	return slices.Concat([]string{"--regions", "3", "--nodes"}, nodes, []string{"--keys", "1", "--dist", "hot",
		"--rate", strconv.Itoa(5 * limit), "--limit", strconv.Itoa(limit), "--duration", "60s", "--shift-at", "30s", "--shift-to", shiftTo(3),
		"--phase", strconv.Itoa(phase) + "s", "--seed", strconv.Itoa(seed)})
}

func (g *gen) afterShift() (string, error) {
	limits := []int{300, 3000}
	var runs [][]string
	for _, row := range afterRows {
		for _, l := range limits {
			for phase := range 10 {
				for seed := 1; seed <= 3; seed++ {
					runs = append(runs, afterArgs(row.nodes, l, phase, seed))
				}
			}
		}
	}
	rs, err := g.sims(runs)
	if err != nil {
		return "", err
	}
	cell := func(rs []*result, i int) string {
		var xs []float64
		n := 0
		for _, r := range rs {
			x := r.iv(i)
			xs = append(xs, x)
			if x >= 95 {
				n++
			}
		}
		return fmt.Sprintf("%d, %s, %s", n, num(mean(xs), 1), num(slices.Min(xs), 1))
	}
	t := table{head: []string{"nodes per region", "L = 300: 2nd interval", "3rd interval", "L = 3000: 2nd interval", "3rd interval"}}
	for i, row := range afterRows {
		var cells []string
		for j := range limits {
			k := (i*len(limits) + j) * 30
			cells = append(cells, cell(rs[k:k+30], 2), cell(rs[k:k+30], 3))
		}
		t.add(append([]string{row.name}, cells...)...)
	}
	tmpl := afterArgs([]string{"$N"}, 0, 0, 0)
	for i, a := range tmpl {
		switch {
		case a == "$N":
			tmpl[i] = a // unquoted: "2 --hot-node" is two words
		case i > 0 && tmpl[i-1] == "--rate":
			tmpl[i] = "$((5 * L))"
		case i > 0 && tmpl[i-1] == "--limit":
			tmpl[i] = "$L"
		case i > 0 && tmpl[i-1] == "--phase":
			tmpl[i] = "${phase}s"
		case i > 0 && tmpl[i-1] == "--seed":
			tmpl[i] = "$seed"
		default:
			tmpl[i] = shellQuote(a)
		}
	}
	return g.header("") + sh(
		"# each row: N = its nodes (2 --hot-node, 2, 8, 32); 30 runs per cell",
		"for L in 300 3000; do for phase in 0 1 2 3 4 5 6 7 8 9; do for seed in 1 2 3; do",
		"  allot-sim "+strings.Join(tmpl, " "),
		"done; done; done") +
		"Each cell: runs >= 95 % of L (of 30), mean, min.\n\n" + t.String(), nil
}

// The accuracy grid: the sandbox's scenario widened, one run each.
var accuracyRows = []struct {
	regions, nodes int
	interval, keys string
}{
	{3, 2, "10s", "1"}, {3, 8, "10s", "1"}, {3, 32, "10s", "1"}, {3, 64, "10s", "1"},
	{3, 2, "2s", "1"}, {3, 8, "2s", "1"}, {3, 32, "2s", "1"}, {3, 64, "2s", "1"},
	{5, 8, "10s", "1"}, {5, 8, "2s", "1"}, {10, 8, "10s", "1"}, {10, 8, "2s", "1"},
	{3, 32, "10s", "10000"}, {3, 32, "10s", "1000000"}, {3, 32, "2s", "10000"},
}

func accuracyArgs(regions, nodes int, interval, keys string) []string {
	dist := []string{"--keys", "1", "--dist", "hot", "--rate", "1500"}
	if keys != "1" {
		dist = []string{"--keys", keys, "--dist", "zipf", "--rate", "10000"}
	}
	return slices.Concat([]string{"--regions", strconv.Itoa(regions), "--nodes", strconv.Itoa(nodes), "--interval", interval}, dist,
		[]string{"--limit", "300", "--duration", "90s", "--shift-at", "30s", "--shift-to", shiftTo(regions), "--phase", "0s", "--seed", "1"})
}

var failovers = []string{"1@35.5s:1s", "1@35.5s:1s,2@35.5s:1s"}

func (g *gen) accuracy() (string, error) {
	var runs [][]string
	var lines []string
	for _, row := range accuracyRows {
		a := accuracyArgs(row.regions, row.nodes, row.interval, row.keys)
		runs = append(runs, a)
		lines = append(lines, simLine(a))
	}
	for _, f := range failovers {
		a := append(accuracyArgs(3, 2, "10s", "1"), "--hot-node", "--failover", f)
		runs = append(runs, a)
		lines = append(lines, simLine(a))
	}
	rs, err := g.sims(runs)
	if err != nil {
		return "", err
	}
	t := table{head: []string{"regions", "nodes/region", "interval", "keys", "before", "1st", "2nd", "after", "adm/ideal", "overshoot/bound", "converged s", "underserved"}}
	var worst, first, second, later []float64
	for i, row := range accuracyRows {
		r := rs[i]
		keys := "1"
		if row.keys != "1" {
			keys = fmt.Sprintf("10^%d Zipf", len(row.keys)-1)
		}
		t.add(strconv.Itoa(row.regions), strconv.Itoa(row.nodes), strings.TrimSuffix(row.interval, "s")+" s", keys,
			num(r.iv(0), 1), num(r.iv(1), 1), num(r.iv(2), 1), num(r.iv(3), 1), num(r.AdmittedOverIdeal, 3),
			num(r.MaxOvershootOverBound, 3), num(r.ConvergedAfterS, 0), strconv.Itoa(r.UnderservedRegionSeconds))
		worst = append(worst, 100*(1+r.MaxOvershootOverBound))
		later = append(later, r.iv(3))
		if row.interval == "10s" {
			first, second = append(first, r.iv(1)), append(second, r.iv(2))
		}
	}
	fo := table{head: []string{"`--failover` (with `--hot-node`, the first row's scenario)", "`max_share_sum`", "`lost_writes`", "`max_overshoot_over_bound`"}}
	for i, f := range failovers {
		r := rs[len(accuracyRows)+i]
		fo.add("`"+f+"`", num(r.MaxShareSum, 3), strconv.Itoa(r.LostWrites), num(r.MaxOvershootOverBound, 3))
	}
	sum := fmt.Sprintf("\nThe worst window used %s %% of the bound; at a 10 s interval the 1st interval after the shift is %s %% of L "+
		"and the 2nd %s %%; from two intervals on every row admits %s %% of L.\n\n",
		span(worst, 1), span(first, 1), span(second, 1), span(later, 1))
	return g.header("") + sh(lines...) + t.String() + sum + fo.String(), nil
}
