package sandbox

import (
	"fmt"
	"net"
)

func splitHostPort(addr string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("sandbox: address %q: %w", addr, err)
	}
	return host, port, nil
}
