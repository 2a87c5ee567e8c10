package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// table is a Markdown table.
type table struct {
	head []string
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) String() string {
	var b strings.Builder
	line := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
	}
	line(t.head)
	b.WriteString(strings.Repeat("|---", len(t.head)) + "|\n")
	for _, r := range t.rows {
		line(r)
	}
	return b.String()
}

// header is a region's first line: where its figures come from.
func (g *gen) header(optIn string) string {
	how := "`make simdocs`"
	if optIn != "" {
		how = fmt.Sprintf("`go run ./internal/tools/simdocs -%s`", optIn)
	}
	return fmt.Sprintf("Generated at `%s` by %s:\n\n", g.commit, how)
}

// sh is a fenced block of shell commands.
func sh(lines ...string) string {
	return "```sh\n" + strings.Join(lines, "\n") + "\n```\n\n"
}

// simLine is allot-sim's command line for args.
func simLine(args []string) string { return "allot-sim " + shellJoin(args) }

// cmdCell is args in a table cell.
func cmdCell(args []string) string {
	if len(args) == 0 {
		return "none"
	}
	return "`" + shellJoin(args) + "`"
}

// num prints x with the given decimals and a real minus sign.
func num(x float64, decimals int) string {
	s := strconv.FormatFloat(x, 'f', decimals, 64)
	if s == "-"+strconv.FormatFloat(0, 'f', decimals, 64) {
		s = s[1:]
	}
	return strings.Replace(s, "-", "−", 1)
}

// pct is a fraction as a percentage with one decimal.
func pct(x float64) string { return num(100*x, 1) }

// count prints n with thousands separators (and the doc's minus sign).
func count[T int | int64](n T) string {
	return strings.Replace(message.NewPrinter(language.English).Sprintf("%d", n), "-", "−", 1)
}

// spread is "mean (min-max)" of xs, one decimal.
func spread(xs []float64) string {
	lo, hi := slices.Min(xs), slices.Max(xs)
	return fmt.Sprintf("%s (%s-%s)", num(mean(xs), 1), num(lo, 1), num(hi, 1))
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

// span is "lo-hi" of xs, or one figure when they agree.
func span(xs []float64, decimals int) string {
	lo, hi := num(slices.Min(xs), decimals), num(slices.Max(xs), decimals)
	if lo == hi {
		return lo
	}
	return lo + " to " + hi
}

// dur prints d to the second, as "8 min 51 s".
func dur(d time.Duration) string {
	d = d.Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%d s", int(d.Seconds()))
	}
	return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
}

// bytesGB prints b in GB (10^9), or MB under one.
func bytesGB(b int64) string {
	if b < 1e9 {
		return fmt.Sprintf("%d MB", int64(math.Round(float64(b)/1e6)))
	}
	return fmt.Sprintf("%.1f GB", float64(b)/1e9)
}
