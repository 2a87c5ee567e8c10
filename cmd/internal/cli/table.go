package cli

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"slices"
	"strings"
)

// TableRow is one row of a Markdown flag table: | `--name` | default | ... |.
type TableRow struct {
	Name    string
	Default string // the cell as written; "" when the table has no default column
}

// FlagTable reads the flag table under the Markdown heading (the whole
// heading line, "### Node flags") of doc: its rows, one flag each, in
// order. A row that does not name exactly one flag as `--name` is an
// error, so a table cannot hide a flag in a row of several.
func FlagTable(doc []byte, heading string) ([]TableRow, error) {
	sc := bufio.NewScanner(bytes.NewReader(doc))
	found, inTable, withDefault := false, false, false
	var rows []TableRow
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !found {
			found = line == heading
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			if strings.HasPrefix(line, "#") {
				break // the next section, and no table
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if !inTable { // the header row
			inTable, withDefault = true, len(cells) > 2 && cells[1] == "default"
			continue
		}
		if strings.Trim(cells[0], "-: ") == "" {
			continue // the separator row
		}
		name, ok := strings.CutPrefix(cells[0], "`--")
		name, ok2 := strings.CutSuffix(name, "`")
		if !ok || !ok2 || strings.ContainsAny(name, "` ,") {
			return nil, fmt.Errorf("%s: row %q: want one flag as `--name` in the first cell", heading, line)
		}
		r := TableRow{Name: name}
		if withDefault {
			r.Default = cells[1]
		}
		rows = append(rows, r)
	}
	if !found {
		return nil, fmt.Errorf("no heading %q", heading)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s: no flag table", heading)
	}
	return rows, sc.Err()
}

// TableDisagreements compares the flags fs defines (what --help lists)
// with a flag table's rows: every flag in one and not the other, a flag
// listed twice, and every default the table gives that is not the
// flag's. A default cell is `value` (as --help prints it), "empty" (the
// empty string), "off" or "on" (booleans). Nil means they agree.
func TableDisagreements(fs *flag.FlagSet, rows []TableRow, withDefaults bool) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range rows {
		if seen[r.Name] {
			out = append(out, fmt.Sprintf("--%s: listed twice in the table", r.Name))
		}
		seen[r.Name] = true
		f := fs.Lookup(r.Name)
		if f == nil {
			out = append(out, fmt.Sprintf("--%s: in the table, not in --help", r.Name))
			continue
		}
		if !withDefaults {
			continue
		}
		want := r.Default
		switch want {
		case "empty":
			want = ""
		case "off":
			want = "false"
		case "on":
			want = "true"
		default:
			v, ok := strings.CutPrefix(want, "`")
			if v, ok2 := strings.CutSuffix(v, "`"); ok && ok2 && !strings.Contains(v, "`") {
				want = v
			} else {
				out = append(out, fmt.Sprintf("--%s: default cell %q: want `value`, empty, off or on", r.Name, r.Default))
				continue
			}
		}
		if want != f.DefValue {
			out = append(out, fmt.Sprintf("--%s: the table says default %q, --help %q", r.Name, want, f.DefValue))
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !seen[f.Name] {
			out = append(out, fmt.Sprintf("--%s: in --help, not in the table", f.Name))
		}
	})
	slices.Sort(out)
	return out
}
