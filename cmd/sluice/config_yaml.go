package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// The file is read with github.com/goccy/go-yaml, chosen over
// go.yaml.in/yaml/v3 (the maintained fork of gopkg.in/yaml.v3) by trying
// both on the configs TestHostileConfigs refuses. Neither names the field
// of an error in its message, but goccy's parser gives every node its
// YAML path (node.GetPath(): "$.limits.message.EVENT[0].rate") and every
// error its token (line and column), so an error is placed by the node it
// belongs to; yaml/v3's errors are only strings with a line number in them
// ("line 7: cannot unmarshal !!str `ten` into float64"), which had to be
// matched back to the tree with regular expressions. goccy also refuses
// duplicate keys in its parser, unknown fields with Strict, and YAML 1.1's
// yes/on as booleans. What it does not do, and is done here: whole numbers
// (it truncates 1.5 into an int, as yaml/v3 does), numbers (it reads "10"
// into a float64, and a plain 1e9 as a string), true/false only (it takes True and TRUE), a null where a
// list of windows belongs (it keeps the default), a map overlaid on the
// default one (it replaces the map), a second document (both libraries
// decode the first and stop), and a byte order mark (goccy reads it as part
// of the first key). It reports the first error of a file, not all of them.
// A string field given an unquoted number gets YAML's reading of it
// (name: 1.10 is "1.1"): quote such strings.

// errConfig is wrapped by every configuration error, so main can tell a bad
// config (exit 2, message names the field) from a failure to run.
var errConfig = errors.New("config")

// maxConfigSize bounds what the parser reads: a config is a page of YAML,
// and a larger file is a mistake (or a file meant to exhaust memory).
const maxConfigSize = 1 << 20

// integer is a whole number in the file. goccy/go-yaml would truncate 1.5
// into an int field without a word; this type refuses it instead.
type integer int64

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (i *integer) UnmarshalYAML(n ast.Node) error {
	if in, ok := n.(*ast.IntegerNode); ok {
		switch v := in.Value.(type) {
		case int64:
			*i = integer(v)
			return nil
		case uint64:
			if v <= math.MaxInt64 {
				*i = integer(v)
				return nil
			}
		}
	}
	return typeError(n, "a whole number")
}

// number is a number in the file: an integer, a float, .inf or .nan.
// goccy/go-yaml would read the string "10" into a float64; this type
// refuses it, as it refuses any other string.
type number float64

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (f *number) UnmarshalYAML(n ast.Node) error {
	switch n := n.(type) {
	case *ast.IntegerNode:
		switch v := n.Value.(type) {
		case int64:
			*f = number(v)
			return nil
		case uint64:
			*f = number(v)
			return nil
		}
	case *ast.FloatNode:
		*f = number(n.Value)
		return nil
	case *ast.InfinityNode:
		*f = number(n.Value)
		return nil
	case *ast.NanNode:
		*f = number(math.NaN())
		return nil
	case *ast.StringNode:
		// goccy/go-yaml reads a plain 1e9 (a float in YAML 1.2) as a
		// string; a quoted number stays a string.
		if tk := n.GetToken(); tk.Type == token.StringType {
			if v, err := strconv.ParseFloat(tk.Value, 64); err == nil {
				*f = number(v)
				return nil
			}
		}
	}
	return typeError(n, "a number")
}

// boolean is true or false in the file, and nothing else. YAML 1.2 also
// reads True and TRUE as booleans (goccy/go-yaml does) and YAML 1.1 yes,
// on and their kin (gopkg.in/yaml.v3 did: `unlimited: yes` turned the
// quota off while `unlimited: "true"` was refused); this type refuses
// them all, and quoted strings.
type boolean bool

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (b *boolean) UnmarshalYAML(n ast.Node) error {
	if _, ok := n.(*ast.BoolNode); ok {
		switch n.GetToken().Value {
		case "true":
			*b = true
			return nil
		case "false":
			*b = false
			return nil
		}
	}
	return typeError(n, "true or false")
}

// typeError says that the value at n is not what its field holds, naming
// the field by its path and position as every parse error does:
// "read_limit (line 1, column 13): expected a whole number, got !!float `1.5`".
func typeError(n ast.Node, want string) error {
	name := fieldPath(n.GetPath())
	if name == "" {
		name = "the file"
	}
	return fmt.Errorf("%s (%s): expected %s, got %s", name, position(n.GetToken()), want, describe(n))
}

// parseConfig decodes a YAML config over the defaults: every field left out
// keeps its default; a message type listed replaces that type's default
// windows, and [] makes it free. Unknown fields, duplicate keys, a second
// document and values of the wrong type are refused, naming the field and
// where the file has it.
func parseConfig(data []byte) (fileConfig, error) {
	return parseConfigOver(defaultFileConfig(), data)
}

// byteOrderMark may start a YAML stream; goccy/go-yaml would read it as
// part of the first key.
var byteOrderMark = []byte("\ufeff")

// parseConfigOver decodes data over fc.
func parseConfigOver(fc fileConfig, data []byte) (fileConfig, error) {
	if len(data) > maxConfigSize {
		return fc, fmt.Errorf("%w: file is larger than %d bytes", errConfig, maxConfigSize)
	}
	data = bytes.TrimPrefix(data, byteOrderMark)
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return fc, fmt.Errorf("%w: %s", errConfig, describeError(err, nil, data))
	}
	if len(file.Docs) > 1 {
		return fc, fmt.Errorf("%w: the file holds more than one YAML document", errConfig)
	}
	if len(file.Docs) == 0 || file.Docs[0].Body == nil {
		return fc, nil // empty, or only comments: the defaults
	}
	body := file.Docs[0].Body
	fields := indexFields(body)
	// goccy/go-yaml keeps a field's default when the file gives it null.
	// For these two, whose defaults are limits, a null is more likely a
	// list or mapping left unfinished than a wish for the defaults, and
	// reading it as either could surprise: refuse it and say what to
	// write. (A null message type decodes as nil, which validate refuses.)
	for _, f := range []struct{ path, msg string }{
		{"limits.connection", "must be a list of windows; write [] for no connection limit"},
		{"limits.message", "must be a mapping of message types to windows; leave it out to keep the defaults"},
	} {
		if mv, ok := fields[f.path].(*ast.MappingValueNode); ok && mv.Value.Type() == ast.NullType {
			return fc, fmt.Errorf("%w: %s (%s): %s", errConfig, f.path, position(mv.Key.GetToken()), f.msg)
		}
	}
	// goccy/go-yaml replaces a map it decodes; the file's message types
	// and frame sizes are laid over the ones before instead.
	message, frameSize := fc.Limits.Message, fc.Limits.FrameSize
	if err := yaml.NodeToValue(body, &fc, yaml.Strict()); err != nil {
		return fc, fmt.Errorf("%w: %s", errConfig, describeError(err, body, data))
	}
	fc.Limits.Message = overlay(message, fc.Limits.Message)
	fc.Limits.FrameSize = overlay(frameSize, fc.Limits.FrameSize)
	fc.at = make(map[string]string, len(fields))
	for path, n := range fields {
		fc.at[path] = position(fieldToken(n))
	}
	return fc, nil
}

// overlay returns over with every key of under that over lacks (nil stays
// nil, for validate to refuse).
func overlay[V any](under, over map[string]V) map[string]V {
	if over == nil {
		return nil
	}
	for k, v := range under {
		if _, ok := over[k]; !ok {
			over[k] = v
		}
	}
	return over
}

// loadConfigFile reads path (at most maxConfigSize bytes) and parses it.
func loadConfigFile(path string) (fileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return defaultFileConfig(), fmt.Errorf("%w: config file: %v", errConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigSize+1))
	if err != nil {
		return defaultFileConfig(), fmt.Errorf("%w: %s: %v", errConfig, path, err)
	}
	fc, err := parseConfig(data)
	if err != nil {
		return fc, fmt.Errorf("%w: %s: %s", errConfig, path, strings.TrimPrefix(err.Error(), errConfig.Error()+": "))
	}
	fc.dir = filepath.Dir(path)
	return fc, nil
}

// indexFields maps the path of every field and list item in the document
// ("limits.message.EVENT[0]") to its node: a *ast.MappingValueNode for a
// field, the item's node for a list item. The first node of a path wins;
// the paths are the parser's own (node.GetPath()).
func indexFields(body ast.Node) map[string]ast.Node {
	out := map[string]ast.Node{}
	ast.Walk(visitor(func(n ast.Node) {
		switch n.Type() {
		case ast.MappingKeyType, ast.CommentType, ast.CommentGroupType:
			return
		}
		if p := fieldPath(n.GetPath()); p != "" {
			if _, ok := out[p]; !ok {
				out[p] = n
			}
		}
	}), body)
	return out
}

// visitor adapts a func to ast.Visitor, visiting every node.
type visitor func(ast.Node)

func (v visitor) Visit(n ast.Node) ast.Visitor {
	v(n)
	return v
}

// fieldToken is where a field starts: its key, or the item itself.
func fieldToken(n ast.Node) *token.Token {
	if mv, ok := n.(*ast.MappingValueNode); ok && mv.Key != nil {
		return mv.Key.GetToken()
	}
	return n.GetToken()
}

// nodeOf returns the first node under root (depth first) whose token is
// tk: the node an error from the decoder is about. A mapping shares its
// token with its first field, and comes first.
func nodeOf(root ast.Node, tk *token.Token) ast.Node {
	var found ast.Node
	ast.Walk(visitor(func(n ast.Node) {
		if found == nil && n.GetToken() == tk {
			found = n
		}
	}), root)
	return found
}

// fieldPath turns the parser's path ("$.limits.message.EVENT[0]") into the
// one messages use ("limits.message.EVENT[0]"); the root is "".
func fieldPath(p string) string {
	return strings.TrimPrefix(strings.TrimPrefix(p, "$"), ".")
}

func position(tk *token.Token) string {
	if tk == nil || tk.Position == nil {
		return "unknown position"
	}
	return fmt.Sprintf("line %d, column %d", tk.Position.Line, tk.Position.Column)
}

// describeError words an error of the parser or the decoder from its type
// and its token, never from its message: "store.redis_url (line 2, column
// 3): unknown field", "listen (line 1, column 9): expected a string, got
// !!seq". A syntax error (duplicate keys among them) keeps the parser's
// words, with the position and, when the line is indented with a tab, why.
// Errors of this file's own types are worded already.
func describeError(err error, body ast.Node, data []byte) string {
	var ye yaml.Error
	if !errors.As(err, &ye) || ye.GetToken() == nil {
		return err.Error()
	}
	tk := ye.GetToken()
	var n ast.Node
	if body != nil {
		n = nodeOf(body, tk)
	}
	var (
		unknown   *yaml.UnknownFieldError
		mistyped  *yaml.TypeError
		misshapen *yaml.UnexpectedNodeTypeError
	)
	switch {
	case n != nil && errors.As(err, &unknown):
		return fmt.Sprintf("%s (%s): unknown field", fieldPath(n.GetPath()), position(tk))
	case n != nil && errors.As(err, &mistyped):
		return typeError(n, describeType(mistyped.DstType)).Error()
	case n != nil && errors.As(err, &misshapen):
		want := "a mapping"
		if misshapen.Expected == ast.SequenceType {
			want = "a list"
		}
		return typeError(n, want).Error()
	}
	msg := fmt.Sprintf("%s: %s", position(tk), ye.GetMessage())
	if tk.Position != nil && indentedWithTab(data, tk.Position.Line) {
		msg += " (YAML does not allow tabs for indentation)"
	}
	return msg
}

// indentedWithTab reports whether line (from 1) of data has a tab in its
// indentation.
func indentedWithTab(data []byte, line int) bool {
	for ; line > 1; line-- {
		var ok bool
		if _, data, ok = bytes.Cut(data, []byte("\n")); !ok {
			return false
		}
	}
	l, _, _ := bytes.Cut(data, []byte("\n"))
	return bytes.IndexByte(l[:len(l)-len(bytes.TrimLeft(l, " \t"))], '\t') >= 0
}

// describeType says what a Go field holds, in the file's terms.
func describeType(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return "a mapping"
}

// describe renders a value as YAML tags it: "!!str `ten`", "!!seq".
func describe(n ast.Node) string {
	var tag string
	switch n := n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		return "!!map"
	case *ast.SequenceNode:
		return "!!seq"
	case *ast.AnchorNode:
		return describe(n.Value)
	case *ast.AliasNode:
		return "an alias"
	case *ast.TagNode:
		tag = n.Start.Value
		if n.Value != nil {
			return fmt.Sprintf("%s `%s`", tag, clip(n.Value.GetToken().Value))
		}
		return tag
	case *ast.StringNode, *ast.LiteralNode:
		tag = "!!str"
	case *ast.IntegerNode:
		tag = "!!int"
	case *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		tag = "!!float"
	case *ast.BoolNode:
		tag = "!!bool"
	case *ast.NullNode:
		tag = "!!null"
	default:
		return n.Type().String()
	}
	return fmt.Sprintf("%s `%s`", tag, clip(n.GetToken().Value))
}

// clip shortens a value quoted in an error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// kindSpec is a kind (7) or an inclusive range of kinds ("20000-29999").
type kindSpec struct{ from, to int64 }

// UnmarshalYAML implements yaml.NodeUnmarshaler.
func (k *kindSpec) UnmarshalYAML(n ast.Node) error {
	switch n := n.(type) {
	case *ast.IntegerNode:
		switch v := n.Value.(type) {
		case int64:
			k.from, k.to = v, v
			return nil
		case uint64:
			if v <= math.MaxInt32 {
				k.from, k.to = int64(v), int64(v)
				return nil
			}
		}
	case *ast.StringNode:
		a, b, ok := strings.Cut(n.Value, "-")
		from, errA := strconv.ParseInt(strings.TrimSpace(a), 10, 64)
		to, errB := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
		if ok && errA == nil && errB == nil {
			k.from, k.to = from, to
			return nil
		}
	}
	return typeError(n, `a kind (a whole number) or a range of kinds ("20000-29999")`)
}
