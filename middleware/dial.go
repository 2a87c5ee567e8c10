package middleware

import (
	"crypto/tls"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial returns a gRPC client connection to the node at target, for
// FromClient. With tlsCfg (see package tlsconfig: the node's CA, and a
// client certificate when the node requires mTLS) it speaks TLS;
// with nil, plaintext. opts are added after the transport credentials.
func Dial(target string, tlsCfg *tls.Config, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := grpc.NewClient(target, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("middleware: dial %s: %w", target, err)
	}
	return conn, nil
}
