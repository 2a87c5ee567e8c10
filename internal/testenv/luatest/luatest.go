// Package luatest lays out the scripts' KEYS and ARGV for tests, from
// plain slices instead of a node's request: the product builds them only
// through lua.AppendCheckTB.
package luatest

import "github.com/allot-dev/allot/lua"

// CheckTBGroups lays out groups given as lua.Check takes them (keys[i], and
// lua.ArgsPerKey values per key in args[i]) for lua.CheckTB: its KEYS and ARGV,
// by lua.AppendCheckTB. A group whose values are not lua.ArgsPerKey per key gets
// spec index 0 for every key.
func CheckTBGroups(keys [][]string, args [][]any) ([]string, []any) {
	cmd := lua.AppendCheckTB(nil, len(keys), func(i int) int { return len(keys[i]) }, func(i, j int) (any, []any, any) {
		a := args[i]
		if len(a) != lua.ArgsPerKey*len(keys[i]) {
			return keys[i][j], nil, nil
		}
		a = a[j*lua.ArgsPerKey : (j+1)*lua.ArgsPerKey]
		return keys[i][j], a[:lua.ArgsPerKey-1], a[lua.ArgsPerKey-1]
	})
	nk := cmd[0].(int)
	ks := make([]string, nk)
	for i := range ks {
		ks[i] = cmd[1+i].(string)
	}
	return ks, cmd[1+nk:]
}
