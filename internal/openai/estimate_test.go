package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// weatherTool is a tool definition, compact: its length is what it adds
// to the text of a request, however the client formats it.
const weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Weather in a city, now.",` +
	`"parameters":{"type":"object","properties":{"city":{"type":"string","description":"e.g. Paris, France"}},"required":["city"]}}}`

func indent(s string) string {
	var b bytes.Buffer
	if err := json.Indent(&b, []byte(s), "    ", "  "); err != nil {
		panic(err)
	}
	return b.String()
}

func TestPromptTokens(t *testing.T) {
	hi := `{"role":"user","content":"hi"}`
	tests := []struct {
		name        string
		body        string
		wantTokens  int
		wantChoices int // 0 means 1
	}{
		// The example: a real (Llama 3.1) server counted 34, with
		// a default system prompt its template adds; see PromptTokens.
		{"chat: text plus per-message and per-request overhead",
			`{"model":"m","messages":[{"role":"user","content":"Say hello in five words."}]}`,
			EstimateTokens(24) + TokensPerMessage + TokensPerRequest, 0},
		{"per-message overhead: empty messages are not free",
			`{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":""},`, 9) + `{"role":"user","content":""}]}`,
			10*TokensPerMessage + TokensPerRequest, 0},
		{"text is summed before rounding up",
			`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`,
			1 + 3*TokensPerMessage + TokensPerRequest, 0},

		// /v1/completions prompts.
		{"token IDs: one each",
			`{"model":"m","prompt":[1,2,3,50256,0]}`, 5, 0},
		{"nested token IDs: summed, a prompt per array",
			`{"model":"m","prompt":[[1,2,3],[4,5],[6]]}`, 6, 3},
		{"nested token IDs with n",
			`{"model":"m","prompt":[[1,2,3],[4,5]],"n":3}`, 5, 6},
		{"empty token-ID arrays",
			`{"model":"m","prompt":[[],[]]}`, 0, 2},
		{"string-array prompt: summed, a BOS and a prompt each",
			`{"model":"m","prompt":["abcd","efgh","ij"]}`, EstimateTokens(10) + 3*TokensPerPrompt, 3},
		{"string prompt",
			`{"model":"m","prompt":"abcdefgh"}`, EstimateTokens(8) + TokensPerPrompt, 0},
		{"suffix counts",
			`{"model":"m","prompt":"abcd","suffix":"efghijkl"}`, EstimateTokens(12) + TokensPerPrompt, 0},
		{"empty prompt array",
			`{"model":"m","prompt":[]}`, 0, 0},

		// Tools.
		{"tools: compact JSON text plus per-tool overhead",
			`{"model":"m","messages":[` + hi + `],"tools":[` + weatherTool + `]}`,
			EstimateTokens(2+len(weatherTool)) + TokensPerMessage + TokensPerRequest + TokensPerTool, 0},
		{"tools: formatting does not change the estimate",
			`{"model":"m","messages":[` + hi + `],"tools":[` + indent(weatherTool) + `,` + indent(weatherTool) + `]}`,
			EstimateTokens(2+2*len(weatherTool)) + TokensPerMessage + TokensPerRequest + 2*TokensPerTool, 0},
		{"tools: whitespace inside strings counts",
			`{"model":"m","tools":[{"type":"function","function":{"name":"f","description":"a    b"}}]}`,
			EstimateTokens(len(`{"type":"function","function":{"name":"f","description":"a    b"}}`)) + TokensPerTool, 0},
		{"legacy functions count as tools",
			`{"model":"m","functions":[{"name":"f","parameters":{"type":"object"}}]}`,
			EstimateTokens(len(`{"name":"f","parameters":{"type":"object"}}`)) + TokensPerTool, 0},
		{"empty tools",
			`{"model":"m","tools":[]}`, 0, 0},

		// What else a message carries.
		{"tool_calls: name and arguments, plus per-call overhead",
			`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[
				{"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
				{"type":"function","function":{"name":"get_time","arguments":"{}"}}]}]}`,
			EstimateTokens(len("get_weather")+len(`{\"city\":\"Paris\"}`)+len("get_time")+len("{}")) +
				TokensPerMessage + TokensPerRequest + 2*TokensPerToolCall, 0},
		{"tool_calls: arguments as an object count as JSON text",
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{ "city" : "Paris" }}}]}]}`,
			EstimateTokens(len("f")+len(`{"city":"Paris"}`)) + TokensPerMessage + TokensPerRequest + TokensPerToolCall, 0},
		{"legacy function_call",
			`{"model":"m","messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`,
			EstimateTokens(3) + TokensPerMessage + TokensPerRequest + TokensPerToolCall, 0},
		{"name counts",
			`{"model":"m","messages":[{"role":"user","name":"alice","content":"hi"}]}`,
			EstimateTokens(len("alice")+2) + TokensPerMessage + TokensPerRequest, 0},
		{"a role beyond the standard ones counts",
			`{"model":"m","messages":[{"role":"narrator","content":"hi"}]}`,
			EstimateTokens(len("narrator")+2) + TokensPerMessage + TokensPerRequest, 0},
		{"other message keys count: a template may render them",
			`{"model":"m","messages":[{"role":"assistant","content":"ok","reasoning_content":"thinking hard"}]}`,
			EstimateTokens(2+len("thinking hard")) + TokensPerMessage + TokensPerRequest, 0},
		{"image parts: by their detail and size (unreadable, or by URL: the most any size costs)",
			`{"model":"m","messages":[{"role":"user","content":[
				{"type":"text","text":"what?"},
				{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 4000) + `"}},
				{"type":"image_url","image_url":{"url":"https://example.com/b.png","detail":"high"}}]}]}`,
			EstimateTokens(5) + 2*ImageTokens("high", 0, 0) + TokensPerMessage + TokensPerRequest, 0},
		{"audio by its size, a file unseen, an untyped image part",
			`{"model":"m","messages":[{"role":"user","content":[
				{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},
				{"type":"file","file":{"file_id":"f1"}},
				{"image_url":{"url":"https://example.com/c.png"}},
				{"text":"untyped text"}]}]}`,
			EstimateTokens(len("untyped text")) + 1 + 2*TokensPerImage + TokensPerMessage + TokensPerRequest, 0},
		{"refusal parts count as text",
			`{"model":"m","messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"I can't."}]}]}`,
			EstimateTokens(len("I can't.")) + TokensPerMessage + TokensPerRequest, 0},
		{"escaped text counts by bytes of JSON text",
			`{"model":"m","messages":[{"role":"user","content":"\u00e9\n"}]}`,
			EstimateTokens(len(`\u00e9\n`)) + TokensPerMessage + TokensPerRequest, 0},

		// n and best_of.
		{"n", `{"model":"m","n":3}`, 0, 3},
		{"n as 2.0", `{"model":"m","n":2.0}`, 0, 2},
		{"best_of above n", `{"model":"m","n":2,"best_of":5}`, 0, 5},
		{"n above best_of", `{"model":"m","n":7,"best_of":5}`, 0, 7},
		{"n null", `{"model":"m","n":null,"best_of":4}`, 0, 4},
		{"n at the limit", `{"model":"m","n":128}`, 0, 128},
		{"n on a string-array prompt",
			`{"model":"m","prompt":["ab","cd"],"n":4}`, EstimateTokens(4) + 2*TokensPerPrompt, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest([]byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest(%s): %v", tt.body, err)
			}
			if tt.wantChoices == 0 {
				tt.wantChoices = 1
			}
			if r.PromptTokens != tt.wantTokens || r.Choices != tt.wantChoices {
				t.Errorf("ParseRequest(%s) = %s\nwant PromptTokens %d, Choices %d", tt.body, fmtRequest(r), tt.wantTokens, tt.wantChoices)
			}
			if r.PromptTokens < EstimateTokens(r.PromptChars) {
				t.Errorf("PromptTokens %d < EstimateTokens(PromptChars %d)", r.PromptTokens, r.PromptChars)
			}
			if err := lastWinsAgrees([]byte(tt.body)); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestParseRequestRefusesDuplicateKeys(t *testing.T) {
	big := strings.Repeat("x", 1000)
	manyKeys := func(extra string) string { // past keySet's linear scan
		var b strings.Builder
		for i := range 20 {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		return `{"model":"m","messages":[{` + b.String() + `"role":"user","content":"hi"` + extra + `}]}`
	}
	tests := []struct {
		name, body, wantParam string
	}{
		{"content in a message: the issue's case",
			`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi","content":"` + big + `"}]}`,
			"messages[1].content"},
		{"content spelled with an escape",
			`{"model":"m","messages":[{"role":"user","content":"hi","cont\u0065nt":"` + big + `"}]}`,
			"messages[0].content"},
		{"role", `{"model":"m","messages":[{"role":"user","content":"hi","role":"system"}]}`, "messages[0].role"},
		{"name", `{"model":"m","messages":[{"role":"user","name":"a","content":"hi","name":"b"}]}`, "messages[0].name"},
		{"tool_calls",
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[],"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}`,
			"messages[0].tool_calls"},
		{"a key the estimate counts but does not interpret",
			`{"model":"m","messages":[{"role":"tool","tool_call_id":"a","content":"hi","tool_call_id":"b"}]}`,
			"messages[0].tool_call_id"},
		{"text in a content part",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"hi","text":"` + big + `"}]}]}`,
			"messages[0].content[1].text"},
		{"type in a content part",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","type":"text","text":"hi"}]}]}`,
			"messages[0].content[0].type"},
		{"function in a tool call",
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"},"function":{"name":"g","arguments":"` + big + `"}}]}]}`,
			"messages[1].tool_calls[0].function"},
		{"arguments in a tool call's function",
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}},{"id":"2","function":{"name":"f","arguments":"{}","arguments":"` + big + `"}}]}]}`,
			"messages[0].tool_calls[1].function.arguments"},
		{"name in a legacy function_call",
			`{"model":"m","messages":[{"role":"assistant","function_call":{"name":"f","name":"g","arguments":"{}"}}]}`,
			"messages[0].function_call.name"},
		{"function in a tool",
			`{"model":"m","tools":[{"type":"function","function":{"name":"f"},"function":{"name":"g","description":"` + big + `"}}]}`,
			"tools[0].function"},
		{"description in a tool's function",
			`{"model":"m","tools":[` + weatherTool + `,{"type":"function","function":{"name":"f","description":"a","description":"` + big + `"}}]}`,
			"tools[1].function.description"},
		{"parameters in a tool's function",
			`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{},"parameters":{"type":"object"}}}]}`,
			"tools[0].function.parameters"},
		{"name in a legacy function",
			`{"model":"m","functions":[{"name":"f","name":"g"}]}`,
			"functions[0].name"},
		{"include_usage in stream_options",
			`{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`,
			"stream_options.include_usage"},
		{"another key in stream_options",
			`{"model":"m","stream":true,"stream_options":{"x":1,"x":2}}`,
			"stream_options.x"},
		{"a message of many keys", manyKeys(`,"k3":0`), "messages[0].k3"},
		{"the empty key", `{"model":"m","messages":[{"":"0","":[]}]}`, "messages[0]."},
		{"a long key is cut short in the param",
			`{"model":"m","messages":[{"` + big + `":1,"` + big + `":2}]}`,
			"messages[0]." + big[:maxKeyInParam] + "..."},
		{"top-level n", `{"model":"m","n":1,"n":100}`, "n"},
		{"top-level best_of", `{"model":"m","best_of":1,"best_of":100}`, "best_of"},
		{"top-level tools", `{"model":"m","tools":[],"tools":[` + weatherTool + `]}`, "tools"},
		{"top-level functions", `{"model":"m","functions":[],"functions":[]}`, "functions"},
		{"top-level prompt", `{"model":"m","prompt":"a","prompt":"` + big + `"}`, "prompt"},
		{"top-level suffix", `{"model":"m","suffix":"a","suffix":"b"}`, "suffix"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest([]byte(tt.body))
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalidField) {
				t.Fatalf("ParseRequest(%.200s) = %s, %v; want a *FieldError", tt.body, fmtRequest(r), err)
			}
			if fe.Param != tt.wantParam || fe.Msg != "appears more than once" {
				t.Errorf("error %q, want Param %q appearing more than once", err, tt.wantParam)
			}
			if !reflect.DeepEqual(r, Request{}) {
				t.Errorf("returned %s with an error", fmtRequest(r))
			}
			// What is refused is what the decoders would read differently
			// (unless the two copies say the same, as for an empty list, or
			// nest past what readParts compares).
			same := strings.Contains(tt.body, `"parameters":{},"parameters"`) || strings.Contains(tt.body, `"functions":[],"functions":[]`)
			if err := lastWinsAgrees([]byte(tt.body)); (err == nil) != same {
				t.Errorf("lastWinsAgrees = %v: the check does not see this repeat", err)
			}
		})
	}
	// The same object without the repeat is fine.
	if _, err := ParseRequest([]byte(manyKeys(""))); err != nil {
		t.Errorf("a message of many distinct keys: %v", err)
	}
}

// TestParseRequestAcceptsWhatDecodersAgreeOn: repeated keys where the
// estimate does not read them (or reads all of them: a schema's JSON text),
// and the same key in different objects, are not duplicates; these bodies
// read the same first-wins and last-wins.
func TestParseRequestAcceptsWhatDecodersAgreeOn(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","temperature":0.1,"temperature":0.9,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"a","url":"b"}}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi","Content":"case differs","content ":"space differs"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi","metadata":{"a":1,"a":2}}]}`,
		`{"model":"m","messages":[{"role":"assistant","name":"bot","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":1,\"a\":2}"}}]}]}`,
		`{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","type":"object","properties":{"a":{},"a":{}}}}}]}`,
		`{"model":"m","stream_options":{"include_usage":true,"Include_usage":false}}`,
		`{"model":"m","prompt":[[1,2],[3]],"n":2,"best_of":3}`,
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\u00e9 \\u00e9 \\ud83d\\ude00\"}]}",
	} {
		if _, err := ParseRequest([]byte(body)); err != nil {
			t.Errorf("ParseRequest(%s): %v", body, err)
		}
		if err := lastWinsAgrees([]byte(body)); err != nil {
			t.Error(err)
		}
	}
}

func TestParseRequestChoicesErrors(t *testing.T) {
	for _, tt := range []struct{ body, param string }{
		{`{"model":"m","n":0}`, "n"},
		{`{"model":"m","n":-1}`, "n"},
		{`{"model":"m","n":1.5}`, "n"},
		{`{"model":"m","n":129}`, "n"},
		{`{"model":"m","n":"2"}`, "n"},
		{`{"model":"m","n":true}`, "n"},
		{`{"model":"m","n":[2]}`, "n"},
		{`{"model":"m","n":1e30}`, "n"},
		{`{"model":"m","n":2,"best_of":0}`, "best_of"},
		{`{"model":"m","best_of":200}`, "best_of"},
		{`{"model":"m","best_of":2.5}`, "best_of"},
	} {
		r, err := ParseRequest([]byte(tt.body))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Param != tt.param {
			t.Errorf("ParseRequest(%s) = %s, %v; want a *FieldError for %s", tt.body, fmtRequest(r), err, tt.param)
			continue
		}
		if want := tt.param + ": must be an integer from 1 to 128"; err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
	}
}

// toolsRef is estimate.tools written with gjson, level by level: the
// reference the one-pass scan must agree with.
func toolsRef(param string, tools gjson.Result) (extra, tokens int, err error) {
	if !tools.IsArray() {
		var e estimate
		e.text(tools)
		return e.extra, 0, nil
	}
	j := 0
	tools.ForEach(func(_, t gjson.Result) bool {
		tokens += TokensPerTool
		extra += compactLen(t.Raw)
		if t.IsObject() {
			path := func() string { return param + "[" + strconv.Itoa(j) + "]" }
			err = eachKey(t, path, func(k string, v gjson.Result) error {
				if k == "function" && v.IsObject() {
					return eachKey(v, func() string { return path() + ".function" }, ignore)
				}
				return nil
			})
		}
		j++
		return err == nil
	})
	return extra, tokens, err
}

// toolsAgree compares estimate.tools with toolsRef on the tools and
// functions of a valid body.
func toolsAgree(body []byte) error {
	for _, param := range []string{"tools", "functions"} {
		v := gjson.GetBytes(body, param)
		if !v.Exists() {
			continue
		}
		var e estimate
		err := e.tools(param, v)
		extra, tokens, refErr := toolsRef(param, v)
		if fmt.Sprint(err) != fmt.Sprint(refErr) || err == nil && (e.extra != extra || e.tokens != tokens) {
			return fmt.Errorf("%s of %q: scan %d chars %d tokens %v; reference %d chars %d tokens %v",
				param, body, e.extra, e.tokens, err, extra, tokens, refErr)
		}
	}
	return nil
}

func TestToolsScan(t *testing.T) {
	for _, body := range []string{
		`{"tools":[]}`, `{"tools":[ ]}`, `{"tools":{}}`, `{"tools":"x"}`, `{"tools":null}`,
		`{"tools":[1, "a b", null, [], [{"a":1,"a":2}], {}]}`,
		`{"tools":[` + weatherTool + `,` + indent(weatherTool) + `]}`,
		`{"tools":[{"type":"function","function":{"name":"f","name":"g"}}]}`,
		`{"tools":[{"type":"function","function":{"n\u0061me":"f","name":"g"}}]}`,
		`{"tools":[{"type":"function","function":{"name":"f"},"function":{}}]}`,
		`{"tools":[{"function":"x","a":{"b":1,"b":2}},{"type":1,"t\u0079pe":2}]}`,
		`{"tools":[{"function":[{"a":1,"a":1}],"x":{"function":{"a":1,"a":1}}}]}`,
		`{"tools":[{"function":{"parameters":{"a":1,"a":2},"d":"\\\"{,:}[]\""}}]}`,
		`{"functions":[{"name":"f","parameters":{"type":"object"}},{"name":"g","name":"h"}]}`,
		`{"tools":[{"":1,"":2}]}`,
	} {
		if !gjson.Valid(body) {
			t.Fatalf("not JSON: %s", body)
		}
		if err := toolsAgree([]byte(body)); err != nil {
			t.Error(err)
		}
	}
}

func TestCompactLen(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		want int
	}{
		{``, 0},
		{`{}`, 2},
		{" { \"a\" : [ 1 , 2 ] }\n", len(`{"a":[1,2]}`)},
		{`"a b"`, 5},
		{`["a \" b", "\\", " "]`, len(`["a \" b","\\"," "]`)},
		{`{"a":"\\\"  "}`, len(`{"a":"\\\"  "}`)},
		{`"unterminated  `, len(`"unterminated  `)},
	} {
		if got := compactLen(tt.raw); got != tt.want {
			t.Errorf("compactLen(%q) = %d, want %d", tt.raw, got, tt.want)
		}
	}
}

func TestKeySet(t *testing.T) {
	var s keySet
	for i := range 100 {
		if s.add(fmt.Sprint(i)) {
			t.Fatalf("add(%d): reported as seen", i)
		}
	}
	for _, i := range []int{0, 7, 8, 99} {
		if !s.add(fmt.Sprint(i)) {
			t.Errorf("add(%d) again: not reported", i)
		}
	}
}

// lastWinsAgrees checks that what the estimate reads of body, decoded
// first-wins (gjson), is what a last-wins decoder reads (encoding/json into
// a map, like Python's json). It answers nil for bodies the two decoders
// disagree on for other reasons: invalid UTF-8, escaped surrogates,
// numbers out of float64's range.
func lastWinsAgrees(body []byte) error {
	if !utf8.Valid(body) || surrogate.Match(body) {
		return nil
	}
	var last any
	if err := json.Unmarshal(body, &last); err != nil {
		return nil
	}
	top, ok := last.(map[string]any)
	if !ok {
		return nil
	}
	first := firstWins(gjson.ParseBytes(body)).(map[string]any)
	a, b := readParts(first), readParts(top)
	if !reflect.DeepEqual(a, b) {
		return fmt.Errorf("body %.300s\nreads, first key wins: %v\nlast key wins: %v", body, a, b)
	}
	return nil
}

var surrogate = regexp.MustCompile(`(?i)\\u[d][89a-f]`)

// firstWins decodes v keeping the first of a repeated key, as gjson reads.
func firstWins(v gjson.Result) any {
	switch {
	case v.IsObject():
		m := map[string]any{}
		v.ForEach(func(k, x gjson.Result) bool {
			if _, ok := m[k.Str]; !ok {
				m[k.Str] = firstWins(x)
			}
			return true
		})
		return m
	case v.IsArray():
		a := []any{}
		v.ForEach(func(_, x gjson.Result) bool { a = append(a, firstWins(x)); return true })
		return a
	}
	return v.Value()
}

// readParts is what ParseRequest interprets of a decoded body: the values
// of the objects it refuses repeated keys in, down to where it stops
// looking (a nested object it counts whole is "{...}").
func readParts(top map[string]any) map[string]any {
	out := map[string]any{}
	for _, k := range []string{"model", "stream", "max_tokens", "max_completion_tokens", "n", "best_of", "suffix"} {
		out[k] = shallow(top[k], nil)
	}
	out["stream_options"] = shallow(top["stream_options"], nil)
	if p, ok := top["prompt"].([]any); ok { // objects in a prompt: no server accepts them
		out["prompt"] = each(p, func(v any) any { return shallow(v, nil) })
	} else {
		out["prompt"] = top["prompt"]
	}
	fn := func(v any) any { return shallow(v, nil) }
	call := func(v any) any { return shallow(v, map[string]func(any) any{"function": fn}) }
	part := func(v any) any { return shallow(v, nil) }
	msg := func(v any) any {
		return shallow(v, map[string]func(any) any{
			"content":       func(c any) any { return each(c, part) },
			"tool_calls":    func(c any) any { return each(c, call) },
			"function_call": fn,
		})
	}
	out["messages"] = each(top["messages"], msg)
	out["tools"] = each(top["tools"], call)
	out["functions"] = each(top["functions"], fn)
	return out
}

func each(v any, f func(any) any) any {
	a, ok := v.([]any)
	if !ok {
		return shallow(v, nil)
	}
	out := make([]any, len(a))
	for i, x := range a {
		out[i] = f(x)
	}
	return out
}

func shallow(v any, descend map[string]func(any) any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			if f, ok := descend[k]; ok {
				out[k] = f(x)
				continue
			}
			switch x.(type) {
			case map[string]any, []any:
				out[k] = "{...}"
			default:
				out[k] = x
			}
		}
		return out
	case []any:
		return "[...]"
	}
	return v
}

// BenchmarkParseRequestTools is BenchmarkParseRequest on a body with six
// tool definitions (toolsBody): the tools' JSON text is scanned.
func BenchmarkParseRequestTools(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(toolsBody)))
	for b.Loop() {
		if _, err := ParseRequest(toolsBody); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzToolsScan: the one-pass scan of tools agrees with toolsRef on any
// JSON value in the tools position.
func FuzzToolsScan(f *testing.F) {
	for _, s := range []string{
		`[]`, `[` + weatherTool + `]`, indent(`[` + weatherTool + `,` + weatherTool + `]`),
		`[{"type":"function","function":{"name":"f","name":"g"}}]`,
		`[{"function":{"n\u0061me":"f","name":"g"},"function":1}]`,
		`[{"function":[{"a":1,"a":1}],"x":{"function":{"a":1,"a":1}}}, "s", 1, null]`,
		`[{"function":{"d":"\\\"{,:}[]\""}}]`, `{}`, `"x"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tools string) {
		body := []byte(`{"tools":` + tools + `}`)
		if !depthOK(body) || !gjson.ValidBytes(body) {
			return
		}
		if err := toolsAgree(body); err != nil {
			t.Fatal(err)
		}
	})
}

// tokenIDBody is a /v1/completions body of about size bytes whose prompt
// is token IDs.
func tokenIDBody(size int) []byte {
	const id = "12345,"
	return []byte(`{"model":"m","prompt":[` + strings.Repeat(id, size/len(id)) + `1]}`)
}

func BenchmarkParseRequestTokenIDs(b *testing.B) {
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"flat", tokenIDBody(960 << 10)},
		{"nested", []byte(`{"model":"m","prompt":[` + strings.Repeat("["+strings.Repeat("12345,", 63)+"1],", 960<<10/384) + "[1]]}")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if _, err := ParseRequest(bc.body); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.body)))
			for b.Loop() {
				if _, err := ParseRequest(bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// promptByValue is prompt's array branch as it was, walking each value
// with gjson: the reference promptArray's byte scan must equal.
func (e *estimate) promptByValue(p gjson.Result) {
	ids := false
	p.ForEach(func(_, q gjson.Result) bool {
		switch {
		case q.Type == gjson.String:
			e.chars += len(q.Raw) - 2
			e.tokens += TokensPerPrompt
			e.prompts++
		case q.IsArray():
			e.prompts++
			q.ForEach(func(_, id gjson.Result) bool {
				if id.Type == gjson.String {
					e.extra += len(id.Raw) - 2
				} else {
					e.tokens++
				}
				return true
			})
		default:
			if t := q.Get("text"); q.IsObject() && t.Type == gjson.String {
				e.chars += len(t.Raw) - 2
			}
			e.tokens++
			ids = true
		}
		return true
	})
	if ids {
		e.prompts++
	}
}

var promptSeeds = []string{
	`[]`, `[1,2,3]`, ` [ 1 , 2 ,3 ] `, `[[1,2],[3]]`, `[[],[]]`, `[[1,"x"],["a\"b",2]]`, `["a","b\\"]`,
	`[1,"two",[3,4],{"text":"five"},null,true,false,-1.5e3]`, `[{"text":1},{"a":{"text":"x"}},{"text":"y","text":"z"}]`,
	`[[[1,2],[3]],[{"a":[1]}],["]","["]]`, "[\n\t1,\r\n2\n]", `["\u00e9\\\\",[" ] , "]]`, `[{"text":"a\"]"}, 7]`,
}

// The byte scan counts exactly what the walk by value counted, on every
// valid JSON array, and on anything else stays within the input.
func FuzzPromptScan(f *testing.F) {
	for _, s := range promptSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		if !gjson.Valid(raw) {
			if strings.HasPrefix(raw, "[") {
				var e estimate
				e.promptArray(raw) // must not panic
			}
			return
		}
		p := gjson.Parse(raw)
		if !p.IsArray() {
			return
		}
		var scan, walk estimate
		scan.promptArray(p.Raw)
		walk.promptByValue(p)
		if scan != walk {
			t.Errorf("%q: scan %+v, walk %+v", raw, scan, walk)
		}
	})
}

// ParseRequest reads the same prompt counts as before the byte scan.
func TestPromptScanInRequests(t *testing.T) {
	for _, p := range promptSeeds {
		body := []byte(`{"model":"m","prompt":` + p + `}`)
		r, err := ParseRequest(body)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		var walk estimate
		walk.promptByValue(gjson.Get(string(body), "prompt"))
		if r.PromptChars != walk.chars || r.PromptTokens != walk.promptTokens() || r.Choices != max(walk.prompts, 1) {
			t.Errorf("%s: chars %d tokens %d choices %d, want %d %d %d", p, r.PromptChars, r.PromptTokens, r.Choices,
				walk.chars, walk.promptTokens(), max(walk.prompts, 1))
		}
	}
}

// BenchmarkPromptTokenIDs counts the prompt of a 960 KB body of token IDs:
// the byte scan against the walk by value it replaced.
func BenchmarkPromptTokenIDs(b *testing.B) {
	p := gjson.GetBytes(tokenIDBody(960<<10), "prompt")
	for _, bc := range []struct {
		name  string
		count func(*estimate)
	}{
		{"scan", func(e *estimate) { e.promptArray(p.Raw) }},
		{"walk", func(e *estimate) { e.promptByValue(p) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(p.Raw)))
			for b.Loop() {
				var e estimate
				bc.count(&e)
				if e.tokens != 960<<10/6+1 {
					b.Fatal(e.tokens)
				}
			}
		})
	}
}
