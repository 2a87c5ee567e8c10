// Package chart_test validates deploy/helm/allot without a cluster: helm
// lint and helm template at a pinned Helm, every rendered manifest decoded
// strictly into the k8s.io/api (and Prometheus Operator) types, and the
// checks that keep the chart honest about the binaries: every flag and
// ALLOT_ variable it passes exists in allot-node --help or
// allot-coordinator --help, the probes hit the node's real paths and
// ports, the rendered args start a real node and coordinator, and the
// policy ConfigMap compiles with policy.Compile.
package chart_test

import (
	"context"
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

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/allot-dev/allot/deploy/check/internal/tool"
	"github.com/allot-dev/allot/internal/testenv/natstest"
	"github.com/allot-dev/allot/internal/testenv/redistest"
	"github.com/allot-dev/allot/policy"
)

var chartDir = tool.Path("deploy", "helm", "allot")

// valuesCase is one install the chart must render: the default values, a
// region of the multi-region install, and one that turns on every
// optional part (TLS and mTLS, Redis and NATS TLS and credentials, the
// ServiceMonitor, extra flags, a policy store from a Secret).
type valuesCase struct {
	name   string
	files  []string // under the chart, or testdata/
	region string
}

var cases = []valuesCase{
	{name: "default"},
	{name: "us", files: []string{filepath.Join(chartDir, "values-us.yaml")}, region: "us"},
	{name: "eu", files: []string{filepath.Join(chartDir, "values-eu.yaml")}, region: "eu"},
	{name: "everything", files: []string{filepath.Join("testdata", "values-everything.yaml")}},
}

func helmArgs(c valuesCase, args ...string) []string {
	for _, f := range c.files {
		abs, err := filepath.Abs(f)
		if err != nil {
			panic(err)
		}
		args = append(args, "-f", abs)
	}
	return args
}

func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	return tool.Run(ctx, t, tool.Root(), tool.Helm, args...)
}

func TestMain(m *testing.M) { tool.Main(m) }

func TestHelmLint(t *testing.T) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := helm(t, helmArgs(c, "lint", "--strict", chartDir)...)
			require.NoError(t, err)
			assert.Contains(t, string(out), "1 chart(s) linted, 0 chart(s) failed")
		})
	}
}

// manifests is one rendering, decoded.
type manifests struct {
	deployments     map[string]*appsv1.Deployment // by component label
	services        []*corev1.Service
	configMaps      []*corev1.ConfigMap
	pdbs            []*policyv1.PodDisruptionBudget
	serviceMonitors []*monitoringv1.ServiceMonitor
	serviceAccounts []*corev1.ServiceAccount
}

func render(t *testing.T, c valuesCase, extra ...string) *manifests {
	t.Helper()
	out, err := helm(t, append(helmArgs(c, "template", "allot", chartDir, "--namespace", "allot"), extra...)...)
	require.NoError(t, err)
	m, err := decode(out)
	require.NoError(t, err)
	return m
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// decode splits a helm template output into documents and decodes each
// strictly into its Kubernetes type: an unknown field, a wrong type or an
// unexpected kind fails.
func decode(out []byte) (*manifests, error) {
	m := &manifests{deployments: map[string]*appsv1.Deployment{}}
	for i, doc := range docSep.Split(string(out), -1) {
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if meta.Kind == "" && strings.TrimSpace(stripComments(doc)) == "" {
			continue // comments only (an empty template)
		}
		strict := func(into any) error {
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				return fmt.Errorf("document %d (%s %s): %w\n%s", i, meta.APIVersion, meta.Kind, err, doc)
			}
			return nil
		}
		var err error
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			d := &appsv1.Deployment{}
			if err = strict(d); err == nil {
				m.deployments[d.Labels["app.kubernetes.io/component"]] = d
			}
		case "v1 Service":
			s := &corev1.Service{}
			err = strict(s)
			m.services = append(m.services, s)
		case "v1 ConfigMap":
			cm := &corev1.ConfigMap{}
			err = strict(cm)
			m.configMaps = append(m.configMaps, cm)
		case "v1 ServiceAccount":
			sa := &corev1.ServiceAccount{}
			err = strict(sa)
			m.serviceAccounts = append(m.serviceAccounts, sa)
		case "policy/v1 PodDisruptionBudget":
			p := &policyv1.PodDisruptionBudget{}
			err = strict(p)
			m.pdbs = append(m.pdbs, p)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			sm := &monitoringv1.ServiceMonitor{}
			err = strict(sm)
			m.serviceMonitors = append(m.serviceMonitors, sm)
		default:
			err = fmt.Errorf("document %d: unexpected %s %s", i, meta.APIVersion, meta.Kind)
		}
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for l := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
		}
	}
	return b.String()
}

func TestDecodeIsStrict(t *testing.T) {
	_, err := decode([]byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 3}\n"))
	require.ErrorContains(t, err, `unknown field "replica"`)
	_, err = decode([]byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"))
	require.ErrorContains(t, err, "unexpected v1 Pod")
}

// args parses a container's "--name=value" args; every arg must have
// that form (the chart renders no other), and none may repeat.
func args(t *testing.T, c corev1.Container) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		require.True(t, ok && strings.HasPrefix(a, "--"), "%s: arg %q is not --name=value", c.Name, a)
		_, dup := out[name]
		require.False(t, dup, "%s: --%s given twice", c.Name, name)
		out[name] = value
	}
	return out
}

func container(t *testing.T, d *appsv1.Deployment) corev1.Container {
	t.Helper()
	require.Len(t, d.Spec.Template.Spec.Containers, 1, d.Name)
	return d.Spec.Template.Spec.Containers[0]
}

func binary(t *testing.T, c corev1.Container) string {
	t.Helper()
	require.Len(t, c.Command, 1, c.Name)
	b := strings.TrimPrefix(c.Command[0], "/")
	require.Contains(t, []string{"allot-node", "allot-coordinator"}, b)
	return b
}

func TestRender(t *testing.T) {
	help := map[string]map[string]bool{
		"allot-node":        tool.Flags(t, "allot-node"),
		"allot-coordinator": tool.Flags(t, "allot-coordinator"),
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := render(t, c)
			require.Contains(t, m.deployments, "node")
			require.Contains(t, m.deployments, "coordinator")
			for comp, d := range m.deployments {
				ctr := container(t, d)
				bin := binary(t, ctr)
				flags := args(t, ctr)
				// The chart cannot drift from the binaries: a flag renamed
				// or removed in the code fails here.
				for name := range flags {
					assert.True(t, help[bin][name], "%s passes --%s, which %s --help does not list", comp, name, bin)
				}
				for _, e := range ctr.Env {
					if name, ok := strings.CutPrefix(e.Name, "ALLOT_"); ok {
						flag := strings.ReplaceAll(strings.ToLower(name), "_", "-")
						assert.True(t, help[bin][flag], "%s sets %s, but %s has no --%s", comp, e.Name, bin, flag)
					}
				}
				checkMounts(t, d)
				if c.region != "" {
					assert.Equal(t, c.region, flags["region"], comp)
					assert.Equal(t, "us,eu", flags["regions"], comp)
					assert.NotEmpty(t, flags["nats"], comp)
				}
			}
			checkNode(t, m.deployments["node"])
			coord := m.deployments["coordinator"]
			assert.EqualValues(t, 2, *coord.Spec.Replicas, "active + standby")
			checkServices(t, m)
			checkPolicies(t, m)
			for _, p := range m.pdbs {
				assert.True(t, selects(p.Spec.Selector.MatchLabels, m.deployments), "PDB %s selects no Deployment", p.Name)
			}
		})
	}
}

// checkNode: probes on the node's real paths, on the port --http-addr
// listens on, and a grace period that outlasts drain plus shutdown.
func checkNode(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	ctr := container(t, d)
	flags := args(t, ctr)
	httpPort := port(t, flags["http-addr"])
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{ctr.ReadinessProbe, "/readyz"}, {ctr.LivenessProbe, "/healthz"}} {
		require.NotNil(t, p.probe, p.path)
		if h := p.probe.HTTPGet; h != nil {
			assert.Equal(t, p.path, h.Path)
			assert.Equal(t, httpPort, containerPort(t, ctr, h.Port), "probe %s must hit --http-addr's port", p.path)
			want := corev1.URISchemeHTTP
			if flags["tls-cert"] != "" {
				want = corev1.URISchemeHTTPS
			}
			assert.Equal(t, want, h.Scheme, p.path)
		} else {
			// mTLS: the kubelet has no client certificate, so a TCP check.
			require.NotNil(t, p.probe.TCPSocket, p.path)
			assert.NotEmpty(t, flags["tls-client-ca"], "a TCP probe only when clients need certificates")
			assert.Equal(t, httpPort, containerPort(t, ctr, p.probe.TCPSocket.Port))
		}
	}
	for flag, name := range map[string]string{"grpc-addr": "grpc", "metrics-addr": "metrics"} {
		assert.Equal(t, port(t, flags[flag]), containerPort(t, ctr, intstr.FromString(name)), flag)
	}
	drain, err := time.ParseDuration(flags["drain-period"])
	require.NoError(t, err)
	grace := time.Duration(*d.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	assert.GreaterOrEqual(t, grace, drain+nodeShutdown, "terminationGracePeriodSeconds must outlast --drain-period + the node's 10 s for calls in flight")
}

// nodeShutdown is how long allot-node lets calls in flight run after its
// drain (fixed; ARCHITECTURE.md, "Fixed settings").
const nodeShutdown = 10 * time.Second

func port(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, ok := strings.Cut(addr, ":")
	require.True(t, ok, "address %q", addr)
	var n int32
	_, err := fmt.Sscan(p, &n)
	require.NoError(t, err, addr)
	return n
}

func containerPort(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("%s has no port named %q", c.Name, p.StrVal)
	return 0
}

func checkMounts(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	vols := map[string]bool{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		vols[v.Name] = true
	}
	for _, vm := range container(t, d).VolumeMounts {
		assert.True(t, vols[vm.Name], "%s mounts %s, which is no volume", d.Name, vm.Name)
		assert.True(t, vm.ReadOnly, vm.Name)
	}
	for flag, path := range args(t, container(t, d)) {
		if strings.HasPrefix(path, "/etc/allot/") {
			assert.True(t, slices.ContainsFunc(container(t, d).VolumeMounts, func(vm corev1.VolumeMount) bool {
				return strings.HasPrefix(path, vm.MountPath+"/")
			}), "--%s=%s is under no mount", flag, path)
		}
	}
}

func selects(sel map[string]string, ds map[string]*appsv1.Deployment) bool {
	for _, d := range ds {
		if matches(sel, d.Spec.Template.Labels) {
			return true
		}
	}
	return false
}

func matches(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkServices: every Service selects a Deployment and targets named
// ports its container has; every ServiceMonitor selects a Service port.
func checkServices(t *testing.T, m *manifests) {
	t.Helper()
	for _, s := range m.services {
		var target *appsv1.Deployment
		for _, d := range m.deployments {
			if matches(s.Spec.Selector, d.Spec.Template.Labels) {
				target = d
			}
		}
		require.NotNil(t, target, "Service %s selects no Deployment", s.Name)
		for _, p := range s.Spec.Ports {
			containerPort(t, container(t, target), p.TargetPort)
		}
	}
	for _, sm := range m.serviceMonitors {
		for _, ep := range sm.Spec.Endpoints {
			found := false
			for _, s := range m.services {
				if matches(sm.Spec.Selector.MatchLabels, s.Labels) {
					found = found || slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
				}
			}
			assert.True(t, found, "ServiceMonitor %s: no selected Service has port %q", sm.Name, ep.Port)
		}
	}
}

// checkPolicies: the chart's ConfigMap holds a policy file the node
// accepts (policy.Parse, then policy.Compile, which validates).
func checkPolicies(t *testing.T, m *manifests) {
	t.Helper()
	for _, cm := range m.configMaps {
		data, ok := cm.Data["policies.yaml"]
		require.True(t, ok, "ConfigMap %s has no policies.yaml", cm.Name)
		f, err := policy.Parse(cm.Name, []byte(data))
		require.NoError(t, err)
		set, err := policy.Compile(cm.Name, f)
		require.NoError(t, err)
		assert.Positive(t, set.Len(), "the default policy file has policies")
	}
}

// TestRenderRefuses: values the binaries would refuse at start fail the
// rendering instead, with a message naming the value.
func TestRenderRefuses(t *testing.T) {
	for sets, msg := range map[string]string{
		"policies.source=bogus":             `policies.source "bogus"`,
		"multiRegion.region=us":             "multiRegion.region needs nats.url",
		"node.antiAffinity=sometimes":       `antiAffinity "sometimes"`,
		"policies.source=store":             "policies.source=store needs",
		"tls.enabled=true":                  "tls.secretName is required",
		"policies.source=existingConfigMap": "policies.existingConfigMap is required",
		"multiRegion.region=ap,multiRegion.regions={us,eu},nats.url=nats://n:4222,redis.addresses={r:6379}": "must include multiRegion.region",
		// Settings of the policy file now: refused, not silently ignored.
		"node.lease.ttl=4s":                                              "the policy file's lease: block",
		"coordinator.rebalance.interval=5s":                              "the policy file's rebalance: block",
		"redis.tls.enabled=true,redis.tls.secretName=a,nats.tlsSecret=b": "one set of client TLS files",
	} {
		out, err := helm(t, "template", "allot", chartDir, "--set", sets)
		require.Error(t, err, sets)
		assert.Contains(t, string(out), msg, sets)
	}
}

// TestRenderedProbesAnswer starts a real allot-node and allot-coordinator
// with the args the default values and a region's values render (listen
// addresses moved to free loopback ports, Redis a real redis-server, NATS
// an embedded server, the policy file from the rendered ConfigMap) and
// asks the probes' paths on the listeners their ports belong to: the
// chart's probes and flag values work on the binaries as built, not only
// on paper.
func TestRenderedProbesAnswer(t *testing.T) {
	for _, c := range cases[:2] { // default, us
		t.Run(c.name, func(t *testing.T) {
			m := render(t, c)
			rds := redistest.Server(t)
			override := map[string]string{"redis": rds.Addr}
			if len(m.configMaps) == 1 {
				policies := filepath.Join(t.TempDir(), "policies.yaml")
				require.NoError(t, os.WriteFile(policies, []byte(m.configMaps[0].Data["policies.yaml"]), 0o600))
				override["store"] = policies
			}
			node := container(t, m.deployments["node"])
			if c.region != "" {
				nats := natstest.Server(t)
				override["nats"] = nats
				if override["store"] == "" {
					override["store"] = nats // policies.source: store, the NATS KV
				}
			}
			addrs := start(t, node, override)
			for _, p := range []*corev1.Probe{node.ReadinessProbe, node.LivenessProbe} {
				get(t, "http://"+addrs["http"]+p.HTTPGet.Path)
			}
			get(t, "http://"+addrs["metrics"]+"/metrics")

			coord := container(t, m.deployments["coordinator"])
			addrs = start(t, coord, override)
			get(t, "http://"+addrs["metrics"]+coord.ReadinessProbe.HTTPGet.Path)
		})
	}
}

// start runs the container's binary with its rendered args, listen
// addresses on free loopback ports, gossip off (no peers here) and
// override's values, and returns the addresses of its HTTP and metrics
// listeners (the coordinator has only the latter).
func start(t *testing.T, c corev1.Container, override map[string]string) map[string]string {
	t.Helper()
	var argv []string
	for name, value := range args(t, c) {
		switch {
		case strings.HasPrefix(name, "gossip-"):
			continue
		case override[name] != "":
			value = override[name]
		case strings.HasSuffix(name, "-addr"):
			value = "127.0.0.1:0"
		}
		argv = append(argv, "--"+name+"="+value)
	}
	// With a password the chart gives Redis as ALLOT_REDIS, a URL the
	// kubelet expands from a Secret: the test's Redis stands in for it.
	for _, e := range c.Env {
		if e.Name == "ALLOT_REDIS" && override["redis"] != "" {
			argv = append(argv, "--redis="+override["redis"])
		}
	}
	want := []string{"metrics"}
	if binary(t, c) == "allot-node" {
		want = append(want, "http")
	}
	return tool.Start(t, filepath.Join(tool.Binaries(t), binary(t, c)), []string{"POD_IP=127.0.0.1", "POD_NAME=test"}, want, argv...)
}

func get(t *testing.T, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, url)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, body)
}
