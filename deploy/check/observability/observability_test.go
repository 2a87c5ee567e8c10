// Package observability_test checks deploy/observability: the alert rules
// pass `promtool check rules` and their unit tests (`promtool test
// rules`, one test per alert at least), the dashboard's queries parse as
// PromQL, and every metric the dashboard and the rules query is one a real
// allot-node or allot-coordinator exports, scraped after checks that make
// the lazily created series exist.
package observability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/deploy/check/internal/tool"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/promtext"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/internal/testenv/rlqsfilter"
)

var dir = tool.Path("deploy", "observability")

func TestMain(m *testing.M) { tool.Main(m) }

func promtool(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := tool.Run(ctx, t, dir, tool.Promtool, args...)
	require.NoError(t, err)
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	assert.Contains(t, promtool(t, "check", "rules", "alerts.yaml"), "SUCCESS")
}

func TestPromtoolTestRules(t *testing.T) {
	assert.Contains(t, promtool(t, "test", "rules", "alerts_test.yaml"), "SUCCESS")
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "alerts.yaml"))
	require.NoError(t, err)
	var f ruleFile
	require.NoError(t, yaml.Unmarshal(b, &f))
	return f
}

// Every alert is exercised by a unit test that expects it to fire, and the
// five the deployment needs are there.
func TestEveryAlertIsUnitTested(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(dir, "alerts_test.yaml"))
	require.NoError(t, err)
	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(b, &tests))
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	var alerts []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			assert.True(t, fires[r.Alert], "no unit test expects %s to fire", r.Alert)
			assert.True(t, silent[r.Alert], "no unit test expects %s to stay silent", r.Alert)
		}
	}
	for _, want := range []string{"AllotFailOpenAnswers", "AllotDegradedAnswers", "AllotBreakerOpen", "AllotRegionNotHeard", "AllotPolicySetRejected", "AllotCheckLatencyOverBudget"} {
		assert.Contains(t, alerts, want)
	}
}

type dashboard struct {
	UID    string  `json:"uid"`
	Panels []panel `json:"panels"`
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "dashboard.json"))
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	require.NotEmpty(t, d.UID)
	return d
}

// grafanaVars are the dashboard's variables, replaced by what Grafana
// would send so the queries parse as PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__range", "1h", "$namespace", ".*")

// The dashboard is valid JSON with unique panel ids, a query on every
// panel, and queries that promtool parses: they are checked as recording
// rules of a generated rule file.
func TestDashboardQueriesParse(t *testing.T) {
	d := readDashboard(t)
	ids := map[int]bool{}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			expr, err := json.Marshal(grafanaVars.Replace(tg.Expr))
			require.NoError(t, err)
			fmt.Fprintf(&rules, "      - record: dashboard:panel_%d_%s\n        expr: %s\n", p.ID, tg.RefID, expr)
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(rules.String()), 0o600))
	assert.Contains(t, promtool(t, "check", "rules", path), "SUCCESS")
}

// metricName finds metric names in PromQL: Allot's all start with allot_.
var metricName = regexp.MustCompile(`\ballot_[a-z0-9_]+`)

// queried returns every metric name the dashboard and the rules query.
func queried(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range readDashboard(t).Panels {
		for _, tg := range p.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				out[m] = append(out[m], "dashboard: "+p.Title)
			}
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				out[m] = append(out[m], "alert: "+r.Alert)
			}
		}
	}
	require.NotEmpty(t, out)
	return out
}

const policies = `default_tier: free
# The coordinators' knobs (fast epochs for the test).
rebalance: {interval: 200ms, share_ttl: 1s}
policies:
  - id: exact-tenant
    match: {}
    per: [tenant]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 2, period: 1s, burst: 2}
    precision: exact
    mode: enforce
    on_store_failure: open
  - id: leased-client
    match: {}
    per: [client]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 1000, period: 1s, burst: 2000}
    precision: leased
    mode: enforce
    on_store_failure: local
  - id: global-route
    match: {route: /global}
    per: [client]
    limits:
      - {name: per_second, algorithm: token_bucket, limit: 100, period: 1s, burst: 200}
    precision: leased
    scope: global
    mode: enforce
`

// TestQueriedMetricsAreExported scrapes a real node, driven through
// allowed, throttled, leased and (Redis killed) failed-open checks, and a
// real coordinator that ran multi-region epochs, and requires every metric
// the dashboard and the rules query among the names they export.
func TestQueriedMetricsAreExported(t *testing.T) {
	bin := tool.Binaries(t)
	tmp := t.TempDir()
	pf := filepath.Join(tmp, "policies.yaml")
	require.NoError(t, os.WriteFile(pf, []byte(policies), 0o600))
	rds := redistest.Server(t)
	// The coordinator's lock lives in a Redis of its own: the node's is
	// killed below to make failed-open answers.
	coordRedis := redistest.Server(t)
	nats := natstest.Server(t)

	node := tool.Start(t, filepath.Join(bin, "allot-node"), nil, []string{"http", "grpc"},
		"--store="+pf, "--redis="+rds.Addr, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0",
		"--region=us", "--regions=us,eu", "--nats="+nats, "--drain-period=0")
	coordinator := tool.Start(t, filepath.Join(bin, "allot-coordinator"), nil, []string{"metrics"},
		"--store="+pf, "--redis="+coordRedis.Addr, "--admin-addr=127.0.0.1:0", "--metrics-addr=127.0.0.1:0",
		"--region=us", "--regions=us,eu", "--nats="+nats, "--lock-ttl=300ms")
	// eu's coordinator, on the same NATS server (one server stands for the
	// gatewayed clusters), so us hears both regions and moves eu's unused
	// share of the global limit to its demand.
	tool.Start(t, filepath.Join(bin, "allot-coordinator"), nil, []string{"metrics"},
		"--store="+pf, "--redis="+redistest.Server(t).Addr, "--admin-addr=127.0.0.1:0", "--metrics-addr=127.0.0.1:0",
		"--region=eu", "--regions=us,eu", "--nats="+nats, "--lock-ttl=300ms")

	// The coordinator's epoch instruments appear once it ran an epoch as
	// the active coordinator: poll its /metrics (bounded).
	var coordMetrics map[string]model.MetricType
	for deadline := time.Now().Add(30 * time.Second); ; {
		for range 20 {
			check(t, node["http"], `{"client_identifier":"hot","route":"/global"}`)
		}
		coordMetrics = scrape(t, coordinator["metrics"])
		if _, ok := coordMetrics["allot_region_share_ratio"]; ok {
			break
		}
		require.True(t, time.Now().Before(deadline), "the coordinator wrote no share in 30s; it exports %v", coordMetrics)
		time.Sleep(100 * time.Millisecond) // poll interval, not synchronisation
	}
	for range 4 { // 2 allowed, then throttled
		check(t, node["http"], `{"tenant_id":"t1","client_identifier":"c1"}`)
	}
	// One RLQS client's bucket of the leased policy: the RLQS counters.
	conn, err := grpc.NewClient(node["grpc"], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	rlqs, err := rlqsfilter.Start(context.Background(), conn, rlqsfilter.Config{Domain: "test", ReportInterval: time.Second})
	require.NoError(t, err)
	defer rlqs.Close()
	rlqs.Allow(map[string]string{"client": "rlqs"}, time.Now())
	require.Eventually(t, func() bool { return rlqs.Responses() > 0 }, 10*time.Second, 10*time.Millisecond)
	rds.Kill() // exact-tenant now fails open, leased-client falls back locally
	for range 3 {
		check(t, node["http"], `{"tenant_id":"t2","client_identifier":"c2"}`)
	}
	exported := scrape(t, node["http"])
	for k, v := range coordMetrics {
		exported[k] = v
	}

	for name, where := range queried(t) {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && exported[b] == model.MetricTypeHistogram {
				base = b
			}
		}
		_, ok := exported[base]
		assert.True(t, ok, "%s (queried by %s) is not exported by node or coordinator", name, strings.Join(slices.Compact(where), ", "))
	}
	// And the lazily created series the alerts rely on did appear.
	for _, name := range []string{"allot_decisions_degraded_total", "allot_redis_calls_total", "allot_breaker_openings_total", "allot_rebalance_regions_heard", "allot_rlqs_assignments_total"} {
		assert.Contains(t, exported, name)
	}
}

// check posts one check to the node's HTTP face; any answer but a 5xx is
// fine here (a 429 is a throttled check).
func check(t *testing.T, addr, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/check", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Less(t, resp.StatusCode, 500, string(b))
}

// scrape returns the metric families /metrics on addr exposes, by name.
func scrape(t *testing.T, addr string) map[string]model.MetricType {
	t.Helper()
	out := map[string]model.MetricType{}
	for name, f := range promtext.Scrape(t, nil, "http://"+addr+"/metrics") {
		switch f.GetType().String() {
		case "HISTOGRAM":
			out[name] = model.MetricTypeHistogram
		case "COUNTER":
			out[name] = model.MetricTypeCounter
		default:
			out[name] = model.MetricTypeGauge
		}
	}
	return out
}
