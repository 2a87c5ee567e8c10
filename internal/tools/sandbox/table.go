package sandbox

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/allot-dev/allot/internal/coord"
	"github.com/allot-dev/allot/internal/tools/loadgen"
)

// WriteTable prints where everything listens and commands to try it.
func (sb *Sandbox) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tCOMPONENT\tADDRESS")
	for _, r := range sb.regions {
		for i, a := range r.RedisAddrs {
			fmt.Fprintf(tw, "%s\tredis %d\t%s\n", r.Name, i, a)
		}
		p := sb.nats.Ports(r.Name)
		fmt.Fprintf(tw, "%s\tnats\t%s (cluster :%d, gateway :%d)\n", r.Name, r.NATSURL, p.Cluster, p.Gateway)
		r.mu.Lock()
		for i := range r.addrs {
			fmt.Fprintf(tw, "%s\tnode %d\tgrpc %s  http %s\n", r.Name, i, r.addrs[i], r.https[i])
		}
		for _, c := range r.coords {
			if c != nil {
				fmt.Fprintf(tw, "%s\tcoordinator\t%s (lock %s)\n", r.Name, c.ID(), coord.LockKey(r.Name))
			}
		}
		r.mu.Unlock()
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("sandbox: write table: %w", err)
	}
	first := sb.regions[0].NodeAddrs()[0]
	var targets []loadgen.Target // every node: a region's traffic is spread over them
	for _, r := range sb.regions {
		for _, a := range r.NodeAddrs() {
			targets = append(targets, loadgen.Target{Region: r.Name, Addr: a})
		}
	}
	_, err := fmt.Fprintf(w, `
policies: %s (global rate limits at L/%d per region until a coordinator writes a share;
  global quotas counted in every region against the whole L)
started in %v

try:
  grpcurl -plaintext -d '{"client_identifier":"k0"}' %s hispeeddesign.ratelimit.v1.RateLimiterService/CheckRateLimit
  go run ./cmd/allot-load --target %s \
      --key-field client --keys zipf --key-count 1000 --rate 3000 --duration 30s --ideal-rate 300
`, displayPath(sb.cfg.Policies), len(sb.regions), sb.started.Round(10e6), first, loadgen.FormatTargets(targets))
	if err != nil {
		return fmt.Errorf("sandbox: write table: %w", err)
	}
	return nil
}

// displayPath is p relative to the working directory when it lies under
// it, so the printed table (and the README's copy of it) names no path of
// the machine it ran on.
func displayPath(p string) string {
	wd, err := os.Getwd()
	if err != nil {
		return p
	}
	rel, err := filepath.Rel(wd, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return p
	}
	return rel
}
