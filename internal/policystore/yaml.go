package policystore

import (
	"bytes"
	"encoding/json"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// EncodeYAML renders v (a policy, a file) as a person would write it in a
// policy file: block YAML, fields in model order, empty fields left out,
// durations as "1s", short lists and limits on one line.
func EncodeYAML(v any) ([]byte, error) {
	js, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return jsonToYAML(js, "")
}

// jsonToYAML re-renders JSON as block YAML. Going through JSON reuses the
// model's JSON tags (omitempty, durations as strings) and keeps field order.
func jsonToYAML(js []byte, header string) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(js, &doc); err != nil {
		return nil, fmt.Errorf("encode policies: %w", err)
	}
	restyle(&doc)
	if len(doc.Content) == 1 {
		doc.Content[0].Style = 0 // the top level stays block style
	}
	doc.HeadComment = header
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("encode policies: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode policies: %w", err)
	}
	return buf.Bytes(), nil
}

// restyle drops null fields, writes scalars plain where YAML allows and
// collections of scalars on one line ({tier: pro}, [tenant]).
func restyle(n *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			if v := n.Content[i+1]; v.Kind != yaml.ScalarNode || v.Tag != "!!null" {
				kept = append(kept, n.Content[i], v)
			}
		}
		n.Content = kept
	}
	flat := true
	for _, c := range n.Content {
		restyle(c)
		if c.Kind != yaml.ScalarNode {
			flat = false
		}
	}
	switch n.Kind {
	case yaml.ScalarNode:
		n.Style = 0 // the encoder still quotes what would read back as another type
	case yaml.MappingNode, yaml.SequenceNode:
		n.Style = 0
		if flat {
			n.Style = yaml.FlowStyle
		}
	}
}
