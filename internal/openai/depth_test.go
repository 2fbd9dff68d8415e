package openai

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// nesting is the reference for depthOK, written differently on purpose: a
// byte-at-a-time state machine with an escape flag (depthOK counts
// backslashes backwards from a quote). It returns the deepest level
// reached before a closing bracket without an opening one.
func nesting(b []byte) int {
	depth, deepest, inString, escaped := 0, 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			deepest = max(deepest, depth)
		case c == ']' || c == '}':
			if depth--; depth < 0 {
				return deepest
			}
		}
	}
	return deepest
}

// nested wraps inner in n arrays.
func nested(n int, inner string) string {
	return strings.Repeat("[", n) + inner + strings.Repeat("]", n)
}

// deepRequest is a valid request whose deepest value nests depth levels
// (the top-level object is one of them).
func deepRequest(depth int) string {
	return `{"model":"m","x":` + nested(depth-1, "1") + `}`
}

func TestDepthOK(t *testing.T) {
	pad := strings.Repeat(" ", MaxDepth) // past the short-input shortcut
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"empty", "", true},
		{"flat object", `{"model":"m"}` + pad, true},
		{"arrays at the limit", nested(MaxDepth, ""), true},
		{"arrays one over", nested(MaxDepth+1, ""), false},
		{"objects at the limit", strings.Repeat(`{"a":`, MaxDepth-1) + "{}" + strings.Repeat("}", MaxDepth-1), true},
		{"objects one over", strings.Repeat(`{"a":`, MaxDepth) + "{}" + strings.Repeat("}", MaxDepth), false},
		{"unclosed over", strings.Repeat("[", MaxDepth+1), false},
		{"many at the limit, one after another", strings.Repeat(nested(MaxDepth, "0")+",", 100), true},
		{"brackets in a string", `["` + strings.Repeat("[{", 1000) + `"]`, true},
		{"escaped quote keeps the string open", `["\"` + strings.Repeat("[", 1000) + `"]`, true},
		{"escaped backslash ends the string", `["\\"` + strings.Repeat("[", MaxDepth) + `"]`, false},
		{"three backslashes escape the quote", `["\\\"` + strings.Repeat("[", 1000) + `"]`, true},
		{"four backslashes do not", `["\\\\"` + strings.Repeat("[", MaxDepth) + `"]`, false},
		{"unicode escape of a backslash is not one", `["\u005c"` + strings.Repeat("[", MaxDepth) + `"]`, false},
		{"unterminated string", `["` + strings.Repeat("[", 1000), true},
		{"closer without opener stops the count", "]" + strings.Repeat("[", 1000), true},
		{"deep after a balanced prefix", nested(MaxDepth, "") + nested(MaxDepth+1, ""), false},
		{"at the limit after brackets in a string", `{"a":"` + strings.Repeat("[", 100) + `","b":` + nested(MaxDepth-1, "") + `}`, true},
		{"over the limit after brackets in a string", `{"a":"` + strings.Repeat("[", 100) + `","b":` + nested(MaxDepth, "") + `}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := []byte(tt.in)
			if got := depthOK(b); got != tt.want {
				t.Errorf("depthOK = %t, want %t", got, tt.want)
			}
			if ref := nesting(b) <= MaxDepth; ref != tt.want {
				t.Errorf("reference nesting = %d, disagrees with the case", nesting(b))
			}
		})
	}
}

func TestDepthOKAllocs(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { depthOK(benchBody) }); n != 0 {
		t.Errorf("depthOK allocates %.0f times", n)
	}
}

// megabyte repeats unit to 1 MiB: the gate's default body limit.
func megabyte(unit string) []byte {
	return bytes.Repeat([]byte(unit), (1<<20)/len(unit))
}

func TestParseRequestTooDeep(t *testing.T) {
	for _, tt := range []struct {
		name string
		body []byte
	}{
		{"1 MiB of [", megabyte("[")},
		{`1 MiB of {"a":`, megabyte(`{"a":`)},
		{"one level over", []byte(deepRequest(MaxDepth + 1))},
		{"deep in a message", []byte(`{"model":"m","messages":[{"role":"user","content":` + nested(MaxDepth, `"x"`) + `}]}`)},
		{"deep after a long string", []byte(`{"model":"m","prompt":"` + strings.Repeat(`\"[`, 1000) + `","x":` + nested(MaxDepth, "") + `}`)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(tt.body)
			if !errors.Is(err, ErrTooDeep) {
				t.Fatalf("ParseRequest error = %v, want ErrTooDeep", err)
			}
			if got != (Request{}) {
				t.Errorf("ParseRequest returned %s with an error", fmtRequest(got))
			}
			if want := "request body nests deeper than 64 levels"; err.Error() != want {
				t.Errorf("error text %q, want %q", err, want)
			}
			if errors.Is(err, ErrInvalidJSON) || errors.Is(err, ErrInvalidField) || errors.Is(err, ErrBadChunk) {
				t.Errorf("ErrTooDeep matches another sentinel: %v", err)
			}
			out, err := WithUsage(tt.body)
			if !errors.Is(err, ErrTooDeep) || out != nil {
				t.Errorf("WithUsage = %.40q, %v; want ErrTooDeep", out, err)
			}
		})
	}
}

// TestParseRequestAtMaxDepth: the limit itself is accepted, and brackets
// inside strings never count.
func TestParseRequestAtMaxDepth(t *testing.T) {
	for _, body := range []string{
		deepRequest(MaxDepth),
		`{"model":"m","stream_options":{"x":` + nested(MaxDepth-2, "") + `}}`, // the rewrite path of WithUsage
		`{"model":"m","prompt":"` + strings.Repeat("[{", 1<<19) + `"}`,
		`{"model":"m","prompt":"` + strings.Repeat(`\"[`, 1000) + `"}`,
	} {
		r, err := ParseRequest([]byte(body))
		if err != nil || r.Model != "m" {
			t.Errorf("ParseRequest(%.60q...) = %s, %v; want model m", body, fmtRequest(r), err)
			continue
		}
		out, err := WithUsage([]byte(body))
		if err != nil {
			t.Errorf("WithUsage(%.60q...): %v", body, err)
			continue
		}
		checkWithUsage(t, []byte(body), out)
	}
}

func TestParseChunkTooDeep(t *testing.T) {
	deep := []byte(`{"model":"m","choices":[{"delta":{"content":"x","x":` + nested(MaxDepth-4, "") + `}}]}`)
	if c, err := ParseChunk(deep); err != nil || !c.Content {
		t.Fatalf("ParseChunk at MaxDepth = %+v, %v; want content", c, err)
	}
	if got := ChunkModel(deep); got != "m" {
		t.Errorf("ChunkModel at MaxDepth = %q, want m", got)
	}
	for _, data := range [][]byte{
		megabyte("["),
		megabyte(`{"a":`),
		[]byte(`{"model":"m","choices":[{"delta":{"content":"x","x":` + nested(MaxDepth-3, "") + `}}]}`),
	} {
		c, err := ParseChunk(data)
		if !errors.Is(err, ErrTooDeep) || !errors.Is(err, ErrBadChunk) {
			t.Errorf("ParseChunk(%.40q...) error = %v, want ErrTooDeep and ErrBadChunk", data, err)
		}
		if c != (Chunk{}) {
			t.Errorf("ParseChunk(%.40q...) = %+v with an error", data, c)
		}
		if want := "stream chunk nests deeper than 64 levels"; err != nil && err.Error() != want {
			t.Errorf("error text %q, want %q", err, want)
		}
		if got := ChunkModel(data); got != "" {
			t.Errorf("ChunkModel(%.40q...) = %q, want none", data, got)
		}
	}
}

// BenchmarkParseRequestDeep: a 1 MiB body nested as deep as it can be is
// refused after its first MaxDepth+1 levels, not validated.
func BenchmarkParseRequestDeep(b *testing.B) {
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"brackets", megabyte("[")},
		{"objects", megabyte(`{"a":`)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseRequest(bc.body); !errors.Is(err, ErrTooDeep) {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDepthCheck is what the depth check adds to BenchmarkParseRequest
// and BenchmarkParseChunk, on the same bodies.
func BenchmarkDepthCheck(b *testing.B) {
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"request", benchBody},
		{"request-with-tools", toolsBody}, // more opening brackets than MaxDepth: the full scan
		{"chunk", benchChunk},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				if !depthOK(bc.body) {
					b.Fatal("refused")
				}
			}
		})
	}
}

// toolsBody is benchBody with six tools' JSON schemas: more opening brackets
// than MaxDepth, so the depth check scans it byte by byte (about 4 KB).
var toolsBody = bytes.Replace(benchBody, []byte(`"user": "user-1234",`), []byte(`"user": "user-1234",
  "tools": [`+strings.Repeat(`
    {"type": "function", "function": {"name": "order_status", "description": "Look up an order and its parcels by order number.",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "description": "The order number, e.g. 88123-AB."},
       "items": {"type": "array", "items": {"type": "object", "properties": {"isbn": {"type": "string"}, "qty": {"type": "integer"}}}}},
       "required": ["order_id"]}}},`, 5)+`
    {"type": "function", "function": {"name": "human", "parameters": {"type": "object", "properties": {}}}}],`), 1)
