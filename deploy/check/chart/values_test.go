package chart_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// nativeKeys hold Kubernetes (or Prometheus Operator) objects, documented
// by their own API: their fields need no comment of ours.
var nativeKeys = map[string]bool{
	"resources": true, "readinessProbe": true, "livenessProbe": true, "securityContext": true,
	"podSecurityContext": true, "nodeTLSConfig": true,
}

// TestValuesDocumented: every field of values.yaml has a comment above it
// (or on its line), so the file documents the chart field by field.
func TestValuesDocumented(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	require.NoError(t, err)
	var doc yaml.Node
	require.NoError(t, yaml.Unmarshal(b, &doc))
	require.Len(t, doc.Content, 1)
	var walk func(path []string, m *yaml.Node)
	walk = func(path []string, m *yaml.Node) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			p := append(append([]string(nil), path...), k.Value)
			comment := strings.TrimSpace(k.HeadComment + k.LineComment + v.LineComment)
			if i == 0 && len(path) == 0 {
				comment = strings.TrimSpace(comment + doc.HeadComment + doc.Content[0].HeadComment)
			}
			assert.NotEmpty(t, comment, "values.yaml: %s has no comment", strings.Join(p, "."))
			if v.Kind == yaml.MappingNode && !nativeKeys[k.Value] {
				walk(p, v)
			}
		}
	}
	walk(nil, doc.Content[0])
}
