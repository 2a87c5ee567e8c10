// Package envoy_test checks the example Envoy configuration without an
// Envoy binary: strict decoding into go-control-plane's bootstrap types.
package envoy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	// The typed configs envoy.yaml uses: imported for their Any types.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// decode reads an Envoy YAML bootstrap strictly: YAML to JSON, then
// protojson with unknown fields refused; every Any (typed_config,
// typed_extension_protocol_options) must resolve to a known type, and the
// whole tree, Any contents included, must pass the protoc-gen-validate
// rules Envoy enforces at load.
func decode(y []byte) (*bootstrapv3.Bootstrap, error) {
	var tree any
	if err := yaml.Unmarshal(y, &tree); err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	j, err := json.Marshal(tree)
	if err != nil {
		return nil, fmt.Errorf("yaml to json: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(j, &b); err != nil {
		return nil, fmt.Errorf("protojson: %w", err)
	}
	if err := validate(&b, "bootstrap"); err != nil {
		return nil, err
	}
	return &b, nil
}

type validator interface{ ValidateAll() error }

// validate checks m and, recursively, the message in each Any under it.
func validate(m proto.Message, where string) error {
	if v, ok := m.(validator); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return protorange.Range(m.ProtoReflect(), func(p protopath.Values) error {
		last := p.Index(-1)
		a, ok := last.Value.Interface().(protoreflect.Message)
		if !ok {
			return nil
		}
		msg, ok := a.Interface().(*anypb.Any)
		if !ok {
			return nil
		}
		inner, err := msg.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s%s: %w", where, p.Path, err)
		}
		return validate(inner, where+p.Path.String()+"("+msg.GetTypeUrl()+")")
	})
}

func TestEnvoyExampleDecodesStrictly(t *testing.T) {
	y, err := os.ReadFile("envoy.yaml")
	require.NoError(t, err)
	b, err := decode(y)
	require.NoError(t, err)
	// What the example is for: the ratelimit filter asking the allot cluster.
	require.Len(t, b.GetStaticResources().GetListeners(), 1)
	var names []string
	for _, c := range b.GetStaticResources().GetClusters() {
		names = append(names, c.GetName())
	}
	assert.ElementsMatch(t, []string{"allot", "api_backend"}, names)
	j, err := protojson.Marshal(b)
	require.NoError(t, err)
	assert.Contains(t, string(j), `"clusterName":"allot"`)
	assert.Contains(t, string(j), "envoy.extensions.filters.http.ratelimit.v3.RateLimit")
}

// The check can fail: a misspelt field, an unknown typed config and a
// value Envoy's validation rules refuse are each caught.
func TestEnvoyDecodeIsStrict(t *testing.T) {
	y, err := os.ReadFile("envoy.yaml")
	require.NoError(t, err)
	for name, edit := range map[string][2]string{
		"misspelt field in a typed config": {"failure_mode_deny:", "failure_mode_denny:"},
		"misspelt field at the top":        {"static_resources:", "static_resource:"},
		"unknown typed config":             {"ratelimit.v3.RateLimit\n", "ratelimit.v3.RateLimitt\n"},
		"validation rule":                  {"connect_timeout: 0.25s", "connect_timeout: -1s"},
		"validation rule inside an Any":    {"stat_prefix: api", `stat_prefix: ""`},
		"unknown protocol options type":    {"upstreams.http.v3.HttpProtocolOptions\n", "upstreams.http.v3.HttpProtocolOption\n"},
	} {
		t.Run(name, func(t *testing.T) {
			bad := strings.Replace(string(y), edit[0], edit[1], 1)
			require.NotEqual(t, string(y), bad, "the edit must apply")
			_, err := decode([]byte(bad))
			assert.Error(t, err)
		})
	}
}
