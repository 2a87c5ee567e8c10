// Package promtext reads Prometheus text expositions, what a node's or a
// coordinator's /metrics serves, with the Prometheus text parser
// (github.com/prometheus/common/expfmt): the scrapes of tests and of the
// overload sweep (internal/tools/loadgen/sweep). It imports nothing of
// the product, and no testing: the sweep links it.
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxBody bounds the exposition Get reads.
const maxBody = 16 << 20

// Parse reads a text exposition (format 0.0.4, UTF-8 names) into its
// metric families by name.
func Parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

// Get GETs the exposition at url with c (nil: http.DefaultClient) and
// parses it; an answer other than 200 OK is an error.
func Get(ctx context.Context, c *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	if c == nil {
		c = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	fams, err := Parse(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return fams, nil
}

// TB is the part of testing.TB that Scrape uses.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// Scrape is Get for a test: it fails t on any error.
func Scrape(t TB, c *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := Get(context.Background(), c, url)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// Value is one series' value: a counter's, a gauge's or an untyped
// metric's, or the sample count of a histogram or a summary; ok is false
// for a series with none of them.
func Value(m *dto.Metric) (v float64, ok bool) {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue(), true
	case m.Gauge != nil:
		return m.GetGauge().GetValue(), true
	case m.Untyped != nil:
		return m.GetUntyped().GetValue(), true
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount()), true
	case m.Summary != nil:
		return float64(m.GetSummary().GetSampleCount()), true
	}
	return 0, false
}

// Labels is m's label set as one string, name="value" pairs joined by
// commas in the parser's order, values escaped as in the exposition: a
// key that tells a family's series apart.
func Labels(m *dto.Metric) string {
	var b strings.Builder
	for i, l := range m.GetLabel() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.GetName())
		b.WriteString(`="`)
		b.WriteString(valueEscaper.Replace(l.GetValue()))
		b.WriteByte('"')
	}
	return b.String()
}

// valueEscaper escapes a label value as the text format does.
var valueEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
