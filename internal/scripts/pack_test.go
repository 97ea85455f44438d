package scripts_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// The scripts read and write numbers packed (little-endian doubles, see
// ewma.lua's "Packed"); the helpers below let the tests write calls and
// values as numbers and read replies and values as text.

// f64 is v as a float64: an int, a float64 or decimal digits.
func f64(v any) float64 {
	switch v := v.(type) {
	case int:
		return float64(v)
	case int64:
		return float64(v)
	case float64:
		return v
	case string:
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			panic(err)
		}
		return f
	}
	panic(fmt.Sprintf("f64 of %T", v))
}

// pack packs the numbers.
func pack(nums ...any) string {
	b := make([]byte, 0, 8*len(nums))
	for _, n := range nums {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(f64(n)))
	}
	return string(b)
}

// value is a stored value: write time t, the windows' scores, then the ids.
func value(t any, scores []float64, ids ...string) string {
	nums := []any{t}
	for _, s := range scores {
		nums = append(nums, s)
	}
	return pack(nums...) + strings.Join(ids, "")
}

// unpack reads v's first n packed numbers.
func unpack(v string, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[8*i:])))
	}
	return out
}

// g is a score as the tests compare it: shortest decimal digits that read
// back as it ("2", "1.5", "0.30000000000000004").
func g(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// show renders a stored value of n windows with ids of width w (0: the
// ids as one) as text:
// "<t> <score_1> ... <score_n> <id>..." ("" for none, "short:<len>" for
// one too short to hold n windows).
func show(v string, n, w int) string {
	if v == "" {
		return ""
	}
	if len(v) < 8+8*n {
		return "short:" + strconv.Itoa(len(v))
	}
	nums := unpack(v, n+1)
	parts := []string{strconv.FormatInt(int64(nums[0]), 10)}
	for _, s := range nums[1:] {
		parts = append(parts, g(s))
	}
	for ids := v[8+8*n:]; ids != ""; {
		k := len(ids)
		if w > 0 {
			k = min(w, k)
		}
		parts = append(parts, ids[:k])
		ids = ids[k:]
	}
	return strings.Join(parts, " ")
}

// text renders a decision's reply of n windows as the flat text the tests
// compare: "1 0 <score>..." admitted, "0 <wait> <score>..." refused,
// "-1 <message>" an error; "?<reply>" for anything else.
func text(r []any, n int) string {
	if len(r) != 2 {
		return fmt.Sprintf("?%v", r)
	}
	w, ok := r[0].(int64)
	v, vok := r[1].(string)
	switch {
	case ok && w == -1 && vok:
		return "-1 " + v
	case !ok || w < 0 || !vok || len(v) < 8+8*n:
		return fmt.Sprintf("?%q", r)
	}
	parts := []string{"1", "0"}
	if w > 0 {
		parts = []string{"0", strconv.FormatInt(w, 10)}
	}
	for _, s := range unpack(v[8:], n) {
		parts = append(parts, g(s))
	}
	return strings.Join(parts, " ")
}
