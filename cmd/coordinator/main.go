// Command allot-coordinator will exchange per-key usage between regions
// over NATS and rebalance each region's share of global limits. It is not
// built yet (see the multi-region issue); it says so and exits non-zero so
// no deployment mistakes it for a working coordinator.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "allot-coordinator: not built yet: multi-region rebalancing is planned (see ARCHITECTURE.md)")
	os.Exit(2)
}
