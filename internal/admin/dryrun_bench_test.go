package admin

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/allot-dev/allot/internal/policystore"
)

// BenchmarkDryRunFile is the dry run's work for a file of n policies:
// decode, apply to the stored set, validate the whole result. It was
// quadratic in n (ApplyFile scanned the set per policy). Run with
//
//	flock /tmp/allot-cpu.lock go test ./admin -run '^$' -bench DryRunFile -benchtime 1x
func BenchmarkDryRunFile(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			var body bytes.Buffer
			body.WriteString(`{"default_tier":"free","policies":[`)
			for i := range n {
				if i > 0 {
					body.WriteByte(',')
				}
				fmt.Fprintf(&body, `{"id":"p%d","match":{"tenant":"t%d"},"per":["tenant"],"limits":[{"name":"per_second","algorithm":"token_bucket","limit":5,"period":"1s"}]}`, i, i)
			}
			body.WriteString(`]}`)
			s := New(Config{Store: policystore.NewMemory()})
			b.SetBytes(int64(body.Len()))
			b.ResetTimer()
			for range b.N {
				change, touched, prob := DecodeChange(body.Bytes())
				if prob != nil {
					b.Fatal(prob.Detail)
				}
				if err := s.check(context.Background(), change, touched); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
