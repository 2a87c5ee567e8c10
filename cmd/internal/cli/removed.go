package cli

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/allot-dev/allot/internal/envflag"
)

// removed names what replaced each flag allot-node and allot-coordinator
// no longer take (ARCHITECTURE.md, "Fixed settings"). Given on the
// command line or as its ALLOT_ variable, such a flag stops the command
// with this sentence instead of Go's bare "flag provided but not
// defined". A name the command still defines (--admin-addr of
// allot-coordinator) is not looked up here.
var removed = map[string]string{
	// Both commands.
	"otlp-endpoint":  "set OTEL_EXPORTER_OTLP_ENDPOINT (http://HOST:4317 plaintext, https:// TLS)",
	"redis-username": "give the user in the --redis URL: redis://USER:PASSWORD@HOST:PORT",
	"redis-password": "give the password in the --redis URL (redis://:PASSWORD@HOST:PORT), best as ALLOT_REDIS",
	"redis-tls":      "use a rediss:// --redis URL",
	"redis-tls-ca":   "use --client-tls-ca with a rediss:// --redis URL",
	"redis-tls-cert": "use --client-tls-cert with a rediss:// --redis URL",
	"redis-tls-key":  "use --client-tls-key with a rediss:// --redis URL",
	"nats-user":      "give the user in the NATS URL: nats://USER:PASSWORD@HOST:PORT",
	"nats-password":  "give the password in the NATS URL (nats://USER:PASSWORD@HOST:PORT), best as an ALLOT_ variable",
	"nats-tls-ca":    "use --client-tls-ca (TLS with a tls:// URL or a server that requires it)",
	"nats-tls-cert":  "use --client-tls-cert",
	"nats-tls-key":   "use --client-tls-key",
	// allot-node.
	"identity-api-key-header":      "use --identity-headers api-key=HEADER",
	"identity-user-header":         "use --identity-headers user=HEADER",
	"identity-tenant-header":       "use --identity-headers tenant=HEADER",
	"check-timeout":                "fixed at 20ms (ARCHITECTURE.md, \"Fixed settings\")",
	"shutdown-timeout":             "fixed at 10s after --drain-period (ARCHITECTURE.md, \"Fixed settings\")",
	"demand-period":                "fixed at 1s (ARCHITECTURE.md, \"Fixed settings\")",
	"lease-target-period":          "set lease.target_period in the policy file (docs/policies.md)",
	"lease-ttl":                    "set lease.ttl in the policy file (docs/policies.md)",
	"lease-low-watermark":          "set lease.low_watermark in the policy file (docs/policies.md)",
	"lease-max-share":              "set lease.max_share in the policy file (docs/policies.md)",
	"lease-cold-hits":              "set lease.cold_hits in the policy file (docs/policies.md)",
	"grpc-max-inflight":            "derived: a quarter of --max-inflight (ARCHITECTURE.md, \"Fixed settings\")",
	"grpc-max-streams":             "fixed at 100 (ARCHITECTURE.md, \"Fixed settings\")",
	"grpc-handshake-timeout":       "fixed at 5s (ARCHITECTURE.md, \"Fixed settings\")",
	"grpc-idle-timeout":            "fixed at 5m (ARCHITECTURE.md, \"Fixed settings\")",
	"gc-percent":                   "set GOGC (the node applies 400 unless GOGC is set)",
	"gomaxprocs":                   "set GOMAXPROCS",
	"pprof":                        "profiles are served on a loopback --metrics-addr",
	"gossip-advertise":             "derived from --gossip-addr (a private address when it binds 0.0.0.0)",
	"gossip-name":                  "derived: the advertised address and start time",
	"gossip-floor":                 "fixed at 2 (ARCHITECTURE.md, \"Fixed settings\")",
	"gossip-probe-interval":        "fixed at 500ms (ARCHITECTURE.md, \"Fixed settings\")",
	"gossip-suspicion-mult":        "fixed at 4 (ARCHITECTURE.md, \"Fixed settings\")",
	"redis-timeout-margin":         "fixed at min(1ms, --redis-timeout/5) (ARCHITECTURE.md, \"Fixed settings\")",
	"redis-lease-timeout":          "fixed at 1s, as a check's wait on a healthy shard (ARCHITECTURE.md, \"Fixed settings\")",
	"redis-stall-max":              "removed: the stall threshold is --redis-timeout less 1ms (README, \"Failure handling\")",
	"redis-pipelines":              "fixed at 1 (ARCHITECTURE.md, \"Fixed settings\")",
	"redis-max-batch":              "fixed at 128 (ARCHITECTURE.md, \"Fixed settings\")",
	"breaker-window":               "removed: the breaker opens on a stall or --breaker-failures in a row",
	"breaker-bucket":               "removed: the breaker opens on a stall or --breaker-failures in a row",
	"breaker-failure-ratio":        "removed: the breaker opens on a stall or --breaker-failures in a row",
	"breaker-min-requests":         "removed: the breaker opens on a stall or --breaker-failures in a row",
	"breaker-consecutive-failures": "renamed --breaker-failures",
	"breaker-open-min":             "fixed at 50ms (ARCHITECTURE.md, \"Fixed settings\")",
	"breaker-probe-after":          "fixed at 50ms (ARCHITECTURE.md, \"Fixed settings\")",
	"redis-max-wait":               "fixed at 1s (ARCHITECTURE.md, \"Fixed settings\")",
	"grpc-max-connections":         "fixed at 4096 (ARCHITECTURE.md, \"Fixed settings\")",
	"breaker-open-for":             "renamed --breaker-max-open",
	// allot-coordinator: the settings document's rebalance: block.
	"interval":        "set rebalance.interval in the policy file (docs/multi-region.md)",
	"gather":          "set rebalance.gather in the policy file (docs/multi-region.md)",
	"heavy-hitter":    "set rebalance.heavy_hitter in the policy file (docs/multi-region.md)",
	"quota-threshold": "set rebalance.quota_threshold in the policy file (docs/multi-region.md)",
	"floor":           "set rebalance.floor in the policy file (docs/multi-region.md)",
	"headroom":        "set rebalance.headroom in the policy file (docs/multi-region.md)",
	"smoothing":       "set rebalance.smoothing in the policy file (docs/multi-region.md)",
	"decay":           "set rebalance.decay in the policy file (docs/multi-region.md)",
	"share-ttl":       "set rebalance.share_ttl in the policy file (docs/multi-region.md)",
}

// checkRemoved fails on the first removed flag in args (up to the end of
// the flags, as package flag reads them) or in the environment, naming
// what replaced it. Flags fs defines are never refused.
func checkRemoved(fs *flag.FlagSet, args []string) error {
	gone := func(name string) string {
		if fs.Lookup(name) != nil {
			return ""
		}
		return removed[name]
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			break // package flag stops here too
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if r := gone(name); r != "" {
			return fmt.Errorf("--%s was removed: %s", name, r)
		}
		f := fs.Lookup(name)
		if f == nil {
			break // package flag reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
			i++ // its value
		}
	}
	names := make([]string, 0, len(removed))
	for name := range removed {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		env := envflag.Name(EnvPrefix, name)
		if _, ok := os.LookupEnv(env); ok {
			if r := gone(name); r != "" {
				return fmt.Errorf("%s (--%s) was removed: %s", env, name, r)
			}
		}
	}
	return nil
}
