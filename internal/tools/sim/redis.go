package sim

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	glua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"

	"github.com/allot-dev/allot/lua"
)

// The simulated Redis runs the project's own scripts (package lua, the
// text Redis is sent) in gopher-lua, Lua 5.1 as in Redis, so the bucket
// arithmetic the simulator exercises is the scripts' and nowhere else's:
// a bug in a script shows up in the simulation. Only the few Redis
// commands the scripts call are emulated, on a compact keyspace, with
// Redis 7.0's conversions between Lua and Redis values and Lua 5.1's
// number formatting (gopher-lua's own differs: see luaToString).

// script names the scripts the simulated fleet runs.
type script int

const (
	scriptLease script = iota
	scriptReturn
	scriptShare
	scriptCheckTB
	scriptLockHold
	scriptLockRelease
	nScripts
)

// Sources are the texts of the scripts the simulator runs, by name:
// "lease", "return", "share", "check_tb", "lock_hold" and "lock_release",
// each as package lua sends it to Redis (common.lua prepended where
// lua/lua.go and lua/coord.go prepend it).
func Sources() map[string]string {
	return map[string]string{
		"lease":        lua.Source(lua.Lease),
		"return":       lua.Source(lua.Return),
		"share":        lua.Source(lua.Share),
		"check_tb":     lua.Source(lua.CheckTB),
		"lock_hold":    lua.Source(lua.LockHold),
		"lock_release": lua.Source(lua.LockRelease),
	}
}

var scriptNames = [nScripts]string{"lease", "return", "share", "check_tb", "lock_hold", "lock_release"}

// Fields of a bucket hash, the only ones the scripts write: a fixed
// layout instead of a map per hash, as a run holds 10^7 of them.
const (
	fTokens = iota
	fTs
	fRate
	fBurst
	fGranted
	fWanted
	nFields
)

var fieldNames = [nFields]string{"tokens", "ts", "rate", "burst", "granted", "wanted"}

func fieldIndex(name string) int {
	for i, f := range fieldNames {
		if f == name {
			return i
		}
	}
	return -1
}

// hash is one key: a Redis hash of the fields above, each a number (the
// scripts store only numbers, as the canonical strings numString renders
// back exactly), and its expiry. 56 bytes.
type hash struct {
	v   [nFields]float64
	has uint8  // bit i: field i is set; 0: the key does not exist
	exp uint32 // expiry in ms since the emulator's epoch, plus 1; 0: none
}

// strVal is a string key: the coordinators' lock (SET by lock_hold.lua),
// the only strings the scripts keep, beside the buckets' hashes.
type strVal struct {
	s   string
	has bool   // the key exists
	exp uint32 // as hash.exp
}

// keyspace is what the emulated commands work on: one region's keys.
type keyspace interface {
	// slot returns key's hash, for reading and writing; write says the
	// caller is about to change it (a journal may keep the old value).
	slot(key string, write bool) *hash
	// str returns key's string slot if key is not a bucket (nil if it
	// is: a bucket is a hash, in slot).
	str(key string) *strVal
}

// num is a command argument's value when the script passed a number
// (its string is then numString's, canonical by construction).
type num struct {
	v  float64
	ok bool
}

// redisEm is the Lua side: one interpreter for the whole simulation (it
// is single-threaded), running a script at a time on a keyspace at a
// virtual time.
type redisEm struct {
	L      *glua.LState
	protos [nScripts]*glua.FunctionProto
	// During a call: the keyspace, TIME in µs, and the ms clock keys
	// expire by (Redis reads the time once per script).
	ks     keyspace
	nowUs  int64
	nowMs  int64
	baseMs int64 // the ms time hash.exp counts from
	calls  int64
	// Buffers reused by every command.
	args []string
	nums []num
	// recent are the last numbers rendered into replies: tonumber reads
	// them back without parsing (the same string is the same number).
	recent [8]struct {
		s string
		v float64
	}
	next int
}

// timeBase is TIME's value at virtual 0, in µs: a real wall clock's order
// of magnitude (the scripts' integers must stay exact there too).
const timeBase = int64(1_800_000_000) * 1_000_000

// newRedisEm compiles the scripts of src (Sources, possibly changed:
// mutants) and prepares an interpreter with Redis's libraries.
func newRedisEm(src map[string]string) (*redisEm, error) {
	L := glua.NewState(glua.Options{SkipOpenLibs: true})
	for _, lib := range []struct {
		name string
		fn   glua.LGFunction
	}{{glua.BaseLibName, glua.OpenBase}, {glua.TabLibName, glua.OpenTable}, {glua.StringLibName, glua.OpenString}, {glua.MathLibName, glua.OpenMath}} {
		L.Push(L.NewFunction(lib.fn))
		L.Push(glua.LString(lib.name))
		L.Call(1, 0)
	}
	e := &redisEm{L: L, baseMs: timeBase / 1000}
	// Lua 5.1's (Redis's) tostring, tonumber and string.format, where
	// gopher-lua's differ (number formatting, "1e+15", "%d").
	L.SetGlobal("tostring", L.NewFunction(luaToString))
	L.SetGlobal("tonumber", L.NewFunction(func(L *glua.LState) int {
		if s, ok := L.Get(1).(glua.LString); ok && L.GetTop() == 1 {
			for _, r := range e.recent {
				if r.s == string(s) && r.s != "" {
					L.Push(glua.LNumber(r.v))
					return 1
				}
			}
		}
		return luaToNumber(L)
	}))
	L.SetField(L.GetGlobal("string"), "format", L.NewFunction(luaFormat))
	for _, name := range []string{"loadstring", "dofile", "loadfile", "load", "require", "module"} {
		L.SetGlobal(name, glua.LNil) // as Redis removes them
	}
	r := L.NewTable()
	L.SetField(r, "call", L.NewFunction(func(L *glua.LState) int { return e.call(L, true) }))
	L.SetField(r, "pcall", L.NewFunction(func(L *glua.LState) int { return e.call(L, false) }))
	L.SetField(r, "error_reply", L.NewFunction(func(L *glua.LState) int { return replyTable(L, "err") }))
	L.SetField(r, "status_reply", L.NewFunction(func(L *glua.LState) int { return replyTable(L, "ok") }))
	L.SetGlobal("redis", r)
	for i, name := range scriptNames {
		text, ok := src[name]
		if !ok {
			return nil, fmt.Errorf("sim: no script %q", name)
		}
		var err error
		if e.protos[i], err = compile(name, text); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func compile(name, text string) (*glua.FunctionProto, error) {
	chunk, err := parse.Parse(strings.NewReader(text), name)
	if err == nil {
		var p *glua.FunctionProto
		if p, err = glua.Compile(chunk, name); err == nil {
			return p, nil
		}
	}
	return nil, fmt.Errorf("sim: script %s: %w", name, err)
}

func replyTable(L *glua.LState, field string) int {
	t := L.NewTable()
	t.RawSetString(field, glua.LString(L.CheckString(1)))
	L.Push(t)
	return 1
}

// replyError is an error reply (a script's redis.error_reply, or a
// command's error the script did not catch).
type replyError string

func (e replyError) Error() string { return string(e) }

// replyStatus is a status reply (redis.status_reply).
type replyStatus string

// eval runs script sc on ks at virtual time nowUs (µs since the start)
// with KEYS and ARGV as EVAL gets them, and returns its reply as a
// client reads it: int64, string, nil, replyStatus, replyError or []any.
func (e *redisEm) eval(ks keyspace, sc script, nowUs int64, keys, argv []string) any {
	return e.run(ks, e.protos[sc], nowUs, keys, argv)
}

func (e *redisEm) run(ks keyspace, proto *glua.FunctionProto, nowUs int64, keys, argv []string) any {
	L := e.L
	e.ks, e.nowUs = ks, timeBase+nowUs
	e.nowMs = e.nowUs / 1000
	e.calls++
	L.SetGlobal("KEYS", strTable(L, keys))
	L.SetGlobal("ARGV", strTable(L, argv))
	L.Push(L.NewFunctionFromProto(proto))
	if err := L.PCall(0, 1, nil); err != nil {
		if ae, ok := err.(*glua.ApiError); ok {
			if t, ok := ae.Object.(*glua.LTable); ok {
				if s, ok := t.RawGetString("err").(glua.LString); ok {
					return replyError(s)
				}
			}
			if s, ok := ae.Object.(glua.LString); ok {
				return replyError("ERR user_script: " + string(s))
			}
		}
		return replyError("ERR " + err.Error())
	}
	v := L.Get(-1)
	L.Pop(1)
	e.ks = nil
	return toReply(v)
}

func strTable(L *glua.LState, ss []string) *glua.LTable {
	t := L.CreateTable(len(ss), 0)
	for _, s := range ss {
		t.Append(glua.LString(s))
	}
	return t
}

// toReply is Redis's conversion of a script's Lua value to a reply: a
// number is truncated to an integer, true is 1, false and nil are nil, a
// table with err or ok is an error or a status, any other table an array
// up to its first nil.
func toReply(v glua.LValue) any {
	switch x := v.(type) {
	case glua.LNumber:
		return int64(float64(x))
	case glua.LString:
		return string(x)
	case glua.LBool:
		if x {
			return int64(1)
		}
		return nil
	case *glua.LTable:
		if s, ok := x.RawGetString("err").(glua.LString); ok {
			return replyError(s)
		}
		if s, ok := x.RawGetString("ok").(glua.LString); ok {
			return replyStatus(s)
		}
		var out []any
		for i := 1; ; i++ {
			el := x.RawGetInt(i)
			if el == glua.LNil {
				break
			}
			out = append(out, toReply(el))
		}
		return out
	}
	return nil
}

// call is redis.call (raise: an error reply raises a Lua error) and
// redis.pcall (it returns {err = ...}).
func (e *redisEm) call(L *glua.LState, raise bool) int {
	n := L.GetTop()
	if n == 0 {
		L.RaiseError("Please specify at least one argument for this redis lib call")
	}
	args, nums := e.args[:0], e.nums[:0]
	for i := range n {
		switch v := L.Get(i + 1).(type) {
		case glua.LString:
			args, nums = append(args, string(v)), append(nums, num{})
		case glua.LNumber:
			// Redis 7.0 formats a number argument with %.17g.
			args, nums = append(args, numString(float64(v))), append(nums, num{float64(v), true})
		default:
			L.RaiseError("Lua redis lib command arguments must be strings or integers")
		}
	}
	e.args, e.nums = args, nums
	rep := e.command(args, nums)
	if er, ok := rep.(replyError); ok {
		t := L.NewTable()
		t.RawSetString("err", glua.LString(er))
		if raise {
			L.Error(t, 1)
		}
		L.Push(t)
		return 1
	}
	L.Push(fromReply(L, rep))
	return 1
}

// fromReply is Redis's conversion of a command's reply to Lua: a nil
// bulk is false.
func fromReply(L *glua.LState, r any) glua.LValue {
	switch x := r.(type) {
	case int64:
		return glua.LNumber(x)
	case string:
		return glua.LString(x)
	case replyStatus:
		t := L.NewTable()
		t.RawSetString("ok", glua.LString(x))
		return t
	case []any:
		t := L.CreateTable(len(x), 0)
		for _, el := range x {
			t.Append(fromReply(L, el))
		}
		return t
	}
	return glua.LFalse
}

var (
	errArgs      = replyError("ERR wrong number of arguments")
	errSyntax    = replyError("ERR syntax error")
	errWrongType = replyError("WRONGTYPE Operation against a key holding the wrong kind of value")
)

// command runs one Redis command on the keyspace. Only what the scripts
// call is modelled; anything else panics, as the simulator would
// otherwise go on with a script that cannot run.
func (e *redisEm) command(args []string, nums []num) any {
	name := args[0]
	switch name {
	case "TIME", "HGET", "HMGET", "HSET", "PEXPIRE", "PTTL", "DEL", "GET", "SET":
	default:
		name = strings.ToUpper(name)
	}
	switch name {
	case "TIME":
		return []any{strconv.FormatInt(e.nowUs/1_000_000, 10), strconv.FormatInt(e.nowUs%1_000_000, 10)}
	case "HGET":
		if len(args) != 3 {
			return errArgs
		}
		h := e.live(args[1], false)
		if h == nil {
			return nil
		}
		return e.get(h, args[2])
	case "HMGET":
		if len(args) < 3 {
			return errArgs
		}
		h := e.live(args[1], false)
		out := make([]any, len(args)-2)
		if h != nil {
			for i, f := range args[2:] {
				out[i] = e.get(h, f)
			}
		}
		return out
	case "HSET":
		if len(args) < 4 || len(args)%2 != 0 {
			return errArgs
		}
		var vs [nFields]float64
		for i := 2; i < len(args); i += 2 {
			f := fieldIndex(args[i])
			if f < 0 {
				panic("sim: the emulated Redis keeps no field " + args[i])
			}
			v, ok := nums[i+1].v, nums[i+1].ok
			if !ok {
				v, ok = canonical(args[i+1])
			}
			if !ok {
				// Stored as a float64, rendered back with %.17g: a string
				// that would not come back as written is refused.
				panic("sim: the emulated Redis cannot keep " + args[i] + " = " + strconv.Quote(args[i+1]))
			}
			vs[f] = v
		}
		h := e.live(args[1], true)
		var added int64
		for i := 2; i < len(args); i += 2 {
			f := fieldIndex(args[i])
			if h.has&(1<<f) == 0 {
				added++
			}
			h.v[f], h.has = vs[f], h.has|1<<f
		}
		return added
	case "PEXPIRE":
		if len(args) != 3 {
			return errArgs
		}
		ms, err := strconv.ParseInt(args[2], 10, 64)
		if err != nil {
			return replyError("ERR value is not an integer or out of range")
		}
		if v := e.ks.str(args[1]); v != nil {
			if !e.liveStr(v) {
				return int64(0)
			}
			if ms <= 0 {
				*v = strVal{}
				return int64(1)
			}
			v.exp = e.expiry(ms)
			return int64(1)
		}
		if e.live(args[1], false) == nil {
			return int64(0)
		}
		h := e.live(args[1], true)
		if ms <= 0 {
			*h = hash{} // a TTL in the past deletes the key
			return int64(1)
		}
		h.exp = e.expiry(ms)
		return int64(1)
	case "PTTL":
		if len(args) != 2 {
			return errArgs
		}
		exp := uint32(0)
		if v := e.ks.str(args[1]); v != nil {
			if !e.liveStr(v) {
				return int64(-2)
			}
			exp = v.exp
		} else {
			h := e.live(args[1], false)
			if h == nil {
				return int64(-2)
			}
			exp = h.exp
		}
		if exp == 0 {
			return int64(-1)
		}
		return max(e.baseMs+int64(exp)-1-e.nowMs, 0)
	case "DEL":
		var n int64
		for _, k := range args[1:] {
			if v := e.ks.str(k); v != nil {
				if e.liveStr(v) {
					*v = strVal{}
					n++
				}
			} else if e.live(k, false) != nil {
				*e.live(k, true) = hash{}
				n++
			}
		}
		return n
	case "GET":
		if len(args) != 2 {
			return errArgs
		}
		if v := e.ks.str(args[1]); v != nil {
			if !e.liveStr(v) {
				return nil
			}
			return v.s
		}
		if e.live(args[1], false) != nil {
			return errWrongType
		}
		return nil
	case "SET":
		// SET key value [NX|XX] [PX ms|EX s]: what lock_hold.lua sends.
		if len(args) < 3 {
			return errArgs
		}
		v := e.ks.str(args[1])
		if v == nil {
			panic("sim: the emulated Redis keeps no string in a bucket's key " + args[1])
		}
		var nx, xx bool
		var ms int64
		for i := 3; i < len(args); i++ {
			switch strings.ToUpper(args[i]) {
			case "NX":
				nx = true
			case "XX":
				xx = true
			case "PX", "EX":
				if i+1 == len(args) {
					return errSyntax
				}
				n, err := strconv.ParseInt(args[i+1], 10, 64)
				if err != nil {
					return replyError("ERR value is not an integer or out of range")
				}
				if n <= 0 {
					return replyError("ERR invalid expire time in 'set' command")
				}
				if strings.EqualFold(args[i], "EX") {
					n *= 1000
				}
				ms = n
				i++
			default:
				return errSyntax
			}
		}
		if nx && xx {
			return errSyntax
		}
		if live := e.liveStr(v); nx && live || xx && !live {
			return nil
		}
		*v = strVal{s: args[2], has: true}
		if ms > 0 {
			v.exp = e.expiry(ms)
		}
		return replyStatus("OK")
	}
	panic("sim: the emulated Redis has no command " + args[0])
}

// live is key's hash, nil if it does not exist (or has expired: Redis
// deletes a key whose expiry is past when it is accessed). write asks for
// the hash to change, existing or not.
func (e *redisEm) live(key string, write bool) *hash {
	h := e.ks.slot(key, false)
	if h.has != 0 && h.exp != 0 && e.nowMs > e.baseMs+int64(h.exp)-1 {
		*e.ks.slot(key, true) = hash{}
	}
	if write {
		return e.ks.slot(key, true)
	}
	if h.has == 0 {
		return nil
	}
	return h
}

// liveStr reports whether string key v exists (deleting it if it has
// expired, as live does).
func (e *redisEm) liveStr(v *strVal) bool {
	if v.has && v.exp != 0 && e.nowMs > e.baseMs+int64(v.exp)-1 {
		*v = strVal{}
	}
	return v.has
}

// expiry is a key's exp field for a TTL of ms from now.
func (e *redisEm) expiry(ms int64) uint32 {
	at := e.nowMs + ms - e.baseMs + 1
	if at >= math.MaxUint32 {
		panic("sim: the emulated Redis keeps TTLs up to 49 days, not " + strconv.FormatInt(ms, 10) + " ms")
	}
	return uint32(at)
}

func (e *redisEm) get(h *hash, field string) any {
	f := fieldIndex(field)
	if f < 0 || h.has&(1<<f) == 0 {
		return nil
	}
	return e.reply(h.v[f])
}

// reply renders field value v for a reply and remembers it for tonumber.
func (e *redisEm) reply(v float64) string {
	s := numString(v)
	r := &e.recent[e.next%len(e.recent)]
	r.s, r.v = s, v
	e.next++
	return s
}

// numString is Redis 7.0's rendering of a Lua number passed to a command
// (%.17g), which is also how the emulated hashes render their fields.
func numString(v float64) string {
	if s, ok := cSpecial(v); ok {
		return s
	}
	return strconv.FormatFloat(v, 'g', 17, 64) // C's %.17g
}

// cSpecial is how C's printf renders infinities and NaN, which Go's
// formatting spells otherwise.
func cSpecial(v float64) (string, bool) {
	switch {
	case math.IsInf(v, 1):
		return "inf", true
	case math.IsInf(v, -1):
		return "-inf", true
	case math.IsNaN(v):
		return "nan", true
	}
	return "", false
}

// canonical parses s if numString renders it back unchanged.
func canonical(s string) (float64, bool) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false
	}
	return v, numString(v) == s
}

// luaToString is Lua 5.1's tostring: numbers as "%.14g" (gopher-lua
// prints Go's shortest form, e.g. 33.333333333333336 for 100/3, where
// Redis's Lua prints 33.333333333333).
func luaToString(L *glua.LState) int {
	v := L.CheckAny(1)
	if n, ok := v.(glua.LNumber); ok {
		L.Push(glua.LString(lua51Number(float64(n))))
		return 1
	}
	L.Push(L.ToStringMeta(v))
	return 1
}

func lua51Number(v float64) string {
	if s, ok := cSpecial(v); ok {
		return s
	}
	return fmt.Sprintf("%.14g", v)
}

// luaToNumber is Lua 5.1's tonumber: strtod's syntax, so "1e+15" reads as
// a number (gopher-lua's wants a '.' to parse exponents), plus 0x hex and
// surrounding spaces; other bases as strtoul.
func luaToNumber(L *glua.LState) int {
	v := L.CheckAny(1)
	base := L.OptInt(2, 10)
	if n, ok := v.(glua.LNumber); ok && base == 10 {
		L.Push(n)
		return 1
	}
	s, ok := v.(glua.LString)
	if !ok {
		if base != 10 {
			L.ArgError(1, "string expected")
		}
		L.Push(glua.LNil)
		return 1
	}
	str := strings.Trim(string(s), " \t\n\v\f\r")
	if base == 10 {
		if f, ok := str2d(str); ok {
			L.Push(glua.LNumber(f))
			return 1
		}
	} else if u, err := strconv.ParseUint(str, base, 64); err == nil {
		L.Push(glua.LNumber(float64(u)))
		return 1
	}
	L.Push(glua.LNil)
	return 1
}

func str2d(s string) (float64, bool) {
	if s == "" {
		return 0, false
	}
	// Most are short whole numbers (ARGV): read without ParseFloat.
	if len(s) <= 15 {
		var n int64
		i := 0
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			n = n*10 + int64(s[i]-'0')
		}
		if i == len(s) {
			return float64(n), true
		}
		if !strings.ContainsAny(s, "0123456789") && !strings.ContainsAny(s, "nN") {
			return 0, false // no digit, no inf or nan: not a number
		}
	}
	if h, ok := strings.CutPrefix(strings.ToLower(s), "0x"); ok {
		u, err := strconv.ParseUint(h, 16, 64)
		return float64(u), err == nil
	}
	if strings.ContainsRune(s, '_') {
		return 0, false // Go's syntax, not strtod's
	}
	f, err := strconv.ParseFloat(s, 64)
	// Out of range, strtod gives ±HUGE_VAL, as ParseFloat does.
	return f, err == nil || errors.Is(err, strconv.ErrRange)
}

// luaFormat is Lua 5.1's string.format on C's printf: %d takes a number
// (truncated), %s a string or a number (as tostring). gopher-lua passes
// its values to Go's fmt, which prints "%!d(lua.LNumber=7)".
func luaFormat(L *glua.LState) int {
	f := L.CheckString(1)
	// The scripts' own formats, on every call: without fmt.
	if L.GetTop() == 2 {
		if n, ok := L.Get(2).(glua.LNumber); ok {
			v := float64(n)
			switch {
			case f == "%.0f" && !math.IsInf(v, 0) && !math.IsNaN(v):
				L.Push(glua.LString(strconv.FormatFloat(v, 'f', 0, 64)))
				return 1
			case f == "%06d" && v >= 0 && v < 1e6:
				d := strconv.FormatInt(int64(v), 10)
				L.Push(glua.LString("000000"[len(d):] + d))
				return 1
			}
		}
	}
	var b strings.Builder
	arg := 1
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i < len(f) && f[i] == '%' {
			b.WriteByte('%')
			continue
		}
		start := i
		for i < len(f) && strings.IndexByte("-+ #0", f[i]) >= 0 {
			i++
		}
		for i < len(f) && (f[i] >= '0' && f[i] <= '9' || f[i] == '.') {
			i++
		}
		if i >= len(f) {
			L.RaiseError("invalid option to 'format'")
		}
		spec, conv := f[start:i], f[i]
		arg++
		switch conv {
		case 'd', 'i':
			fmt.Fprintf(&b, "%"+spec+"d", int64(float64(L.CheckNumber(arg))))
		case 'u':
			fmt.Fprintf(&b, "%"+spec+"d", uint64(int64(float64(L.CheckNumber(arg)))))
		case 'c':
			b.WriteByte(byte(int64(float64(L.CheckNumber(arg)))))
		case 'o', 'x', 'X':
			fmt.Fprintf(&b, "%"+spec+string(conv), uint64(int64(float64(L.CheckNumber(arg)))))
		case 'e', 'E', 'f', 'g', 'G':
			v := float64(L.CheckNumber(arg))
			if math.IsInf(v, 0) || math.IsNaN(v) {
				b.WriteString(lua51Number(v))
			} else {
				fmt.Fprintf(&b, "%"+spec+string(conv), v)
			}
		case 's':
			var s string
			if n, ok := L.Get(arg).(glua.LNumber); ok {
				s = lua51Number(float64(n))
			} else {
				s = L.CheckString(arg)
			}
			fmt.Fprintf(&b, "%"+spec+"s", s)
		default:
			L.RaiseError("invalid option '%%%c' to 'format'", conv)
		}
	}
	L.Push(glua.LString(b.String()))
	return 1
}
