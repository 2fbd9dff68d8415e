package policy

import (
	"bytes"
	"encoding/json"
	"math"
	"math/big"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// decodeJSON decodes bs as Go values, numbers as json.Number.
func decodeJSON(t *testing.T, bs []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(bs))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("decode %s: %v", bs, err)
	}
	return v
}

// equalJSON reports whether a and b are the same JSON document: equal
// structure and strings, numbers compared by value (1e3 is 1000).
func equalJSON(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !equalJSON(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equalJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		if a == b {
			return true
		}
		// big.Float, not big.Rat: 1e999999999 must not take forever.
		x, _, errx := big.ParseFloat(string(a), 10, 256, big.ToNearestEven)
		y, _, erry := big.ParseFloat(string(b), 10, 256, big.ToNearestEven)
		return errx == nil && erry == nil && x.Cmp(y) == 0
	default:
		return a == b
	}
}

// checkValue asserts that in.Value() is what json.Marshal(in) decodes to.
func checkValue(t *testing.T, in *Input) {
	t.Helper()
	v := in.Value() // must not panic, whatever the input
	want, err := json.Marshal(in)
	if err != nil {
		return // e.g. a NaN claim: JSON has no form for it
	}
	// Compared as Go values, not as JSON text: marshalling would hide
	// strings that are not valid UTF-8.
	got, err := ast.JSON(v)
	if err != nil {
		t.Fatalf("ast.JSON: %v", err)
	}
	if !equalJSON(got, decodeJSON(t, want)) {
		t.Errorf("Value() is\n%v\njson.Marshal is\n%s", v, want)
	}
}

func TestInputValue(t *testing.T) {
	type custom struct {
		A string `json:"a"`
		B []int  `json:"b,omitempty"`
	}
	inputs := map[string]*Input{
		"zero":      {},
		"realistic": benchInput(),
		"claims": {
			Principal: Principal{ID: "alice", Type: "jwt", Claims: map[string]any{
				"sub": "alice", "exp": 1.9e9, "aud": []any{"a", "b"}, "groups": []string{"x"},
				"nested": map[string]any{"n": nil, "t": true, "f": 0.1, "big": 1e21, "neg": math.Copysign(0, -1)},
				"ints":   []any{int8(-1), int16(2), int32(3), int64(math.MaxInt64), uint(4), uint8(5), uint16(6), uint32(7), uint64(math.MaxUint64)},
				"f32":    float32(0.1),
				"num":    json.Number("12.50"), "empty_num": json.Number(""),
				"strmap": map[string]string{"k": "v"}, "nilmap": map[string]string(nil), "nilslice": []any(nil),
				"custom": custom{A: "x"}, "ptr": &custom{B: []int{1}}, "raw": json.RawMessage(`{"r":[1,2]}`),
			}},
		},
		"invalid utf-8": {
			Tenant:  "t\xff\xfe",
			Labels:  map[string]string{"\xff": "a", "\xfe": "b", "\uFFFD": "c", "ok": "v\xc3"},
			Request: Request{Headers: map[string]string{"h\x80": "\xed\xa0\x80"}},
			Principal: Principal{Claims: map[string]any{
				"k\xff": []any{"\xffx", map[string]any{"\xfe": "y"}},
			}},
		},
		"unsupported claims": {
			Principal: Principal{Claims: map[string]any{
				"nan": math.NaN(), "inf": math.Inf(1), "bad_num": json.Number("1e"), "chan": make(chan int),
			}},
		},
	}
	for name, in := range inputs {
		t.Run(name, func(t *testing.T) { checkValue(t, in) })
	}
	if v := (*Input)(nil).Value(); v.Compare(ast.NullValue) != 0 {
		t.Errorf("nil input = %v, want null", v)
	}
}

func TestValidNumber(t *testing.T) {
	for s, want := range map[string]bool{
		"0": true, "-0": true, "12": true, "1.5": true, "-1.5e+10": true, "1E5": true, "0.0": true,
		"": false, "-": false, "01": false, "1.": false, ".5": false, "1e": false, "1e+": false,
		"+1": false, "0x10": false, "NaN": false, "Inf": false, "1_000": false, " 1": false, "1 ": false,
	} {
		if got := validNumber(s); got != want {
			t.Errorf("validNumber(%q) = %v, want %v", s, got, want)
		}
		var n json.Number
		stdOK := json.Unmarshal([]byte(s), &n) == nil && s != "" && s[0] != ' ' && s[len(s)-1] != ' '
		if stdOK != want {
			t.Errorf("validNumber(%q) disagrees with encoding/json", s)
		}
	}
}

func FuzzInputValue(f *testing.F) {
	f.Add("key-1", "api_key", "acme", "POST", "/v1/chat/completions", "llama", "user-agent", "curl", "tier", "free",
		[]byte(`{"sub":"alice","exp":1.9e9,"aud":["a"],"x":{"y":null}}`), false, 256, int64(7), 0.5, true)
	f.Add("\xff", "anonymous", "", "GET", "", "", "\xfe", "\xff", "", "", []byte(`{"\ud800":"\udfff","n":1e400}`), true, -1, int64(-5), math.NaN(), false)
	f.Add("", "", "", "", "", "", "", "", "", "", []byte(`[1,2]`), false, 0, int64(0), math.Inf(-1), false)
	f.Add("a", "jwt", "t", "m", "p", "model", "h", "v", "l", "w", []byte(`{"a":[[[[{}]]]],"b":-0,"c":1E-7}`), true, math.MaxInt, int64(math.MinInt64), 1e300, true)
	f.Fuzz(func(t *testing.T, id, typ, tenant, method, path, model, hk, hv, lk, lv string,
		claims []byte, useNumber bool, maxTokens int, usage int64, fl float64, maps bool) {
		in := &Input{
			Principal: Principal{ID: id, Type: typ},
			Tenant:    tenant,
			Request: Request{
				Method: method, Path: path, API: lk, Model: model, VirtualModel: model + tenant,
				PreviousResponseID: lv,
				Stream:             maps, MaxTokens: maxTokens, EstimatedPromptTokens: -maxTokens,
			},
			Usage: Usage{Requests: usage, Tokens: -usage},
		}
		if maps {
			in.Labels = map[string]string{lk: lv, lv: lk}
			in.Request.Headers = map[string]string{hk: hv}
		}
		d := json.NewDecoder(bytes.NewReader(claims))
		if useNumber {
			d.UseNumber()
		}
		var c map[string]any
		if d.Decode(&c) == nil {
			in.Principal.Claims = c
		} else if maps {
			in.Principal.Claims = map[string]any{}
		}
		if in.Principal.Claims != nil {
			in.Principal.Claims["fuzz_float"] = fl
			in.Principal.Claims["fuzz_int"] = usage
			in.Principal.Claims["fuzz_strings"] = []string{hk, hv}
			in.Principal.Claims["fuzz_number"] = json.Number(lv)
		}
		checkValue(t, in)
	})
}
