package openai

import (
	"errors"
	"strings"
	"testing"
)

func TestParseEmbeddings(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Request
	}{
		{"string", `{"model":"bge-m3","input":"The food was delicious."}`,
			Request{Model: "bge-m3", PromptChars: 23, PromptTokens: EstimateTokens(23) + TokensPerPrompt, Choices: 1}},
		{"strings: each a sequence", `{"model":"m","input":["abcd","efgh","ij"],"encoding_format":"float"}`,
			Request{Model: "m", PromptChars: 10, PromptTokens: EstimateTokens(10) + 3*TokensPerPrompt, Choices: 1}},
		{"token IDs: counted exactly", `{"model":"m","input":[1,2,3,50256]}`,
			Request{Model: "m", PromptTokens: 4, Choices: 1}},
		{"token-ID arrays: summed", `{"model":"m","input":[[1,2,3],[4],[5,6]],"dimensions":256}`,
			Request{Model: "m", PromptTokens: 6, Choices: 1, Dimensions: 256}},
		{"null dimensions, other keys ignored", `{"model":"m","input":"x","dimensions":null,"user":"u","user":"v"}`,
			Request{Model: "m", PromptChars: 1, PromptTokens: 1 + TokensPerPrompt, Choices: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseEmbeddings([]byte(tc.body))
			r.MaxPromptTokens = 0 // TestMaxPromptTokens
			if err != nil || r != tc.want {
				t.Errorf("ParseEmbeddings(%s) = %+v, %v\nwant %+v", tc.body, r, err, tc.want)
			}
		})
	}
}

func TestParseEmbeddingsErrors(t *testing.T) {
	for body, param := range map[string]string{
		`{"input":"x"}`:                              "",
		`{"model":"m"}`:                              "input",
		`{"model":"m","input":null}`:                 "input",
		`{"model":"m","input":[]}`:                   "input",
		`{"model":"m","input":[[]]}`:                 "input",
		`{"model":"m","input":{"text":"x"}}`:         "input",
		`{"model":"m","input":["a",1]}`:              "input",
		`{"model":"m","input":[1,[2]]}`:              "input",
		`{"model":"m","input":[1.5]}`:                "input",
		`{"model":"m","input":[-1]}`:                 "input",
		`{"model":"m","input":[[1,"a"]]}`:            "input",
		`{"model":"m","input":[true]}`:               "input",
		`{"model":"m","input":"x","dimensions":0}`:   "dimensions",
		`{"model":"m","input":"x","dimensions":"8"}`: "dimensions",
		`{"model":"m","input":"x","input":"y"}`:      "input",
		`{"model":"m","model":"n","input":"x"}`:      "model",
		`{"model":7,"input":"x"}`:                    "model",
	} {
		_, err := ParseEmbeddings([]byte(body))
		if param == "" {
			if !errors.Is(err, ErrMissingModel) {
				t.Errorf("%s: %v, want a missing model", body, err)
			}
			continue
		}
		wantParseError(t, body, err, param)
	}
	if _, err := ParseEmbeddings([]byte(`{"model":"m","input":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`)); !errors.Is(err, ErrTooDeep) {
		t.Errorf("deep input: %v", err)
	}
	if _, err := ParseEmbeddings([]byte(`{"model":"m","input":"x"`)); !errors.Is(err, ErrInvalidJSON) {
		t.Errorf("truncated body: %v", err)
	}
}

func FuzzParseEmbeddings(f *testing.F) {
	for _, s := range []string{
		`{"model":"bge-m3","input":"The food was delicious."}`,
		`{"model":"m","input":["a","b"],"dimensions":64,"encoding_format":"base64"}`,
		`{"model":"m","input":[1,2,3]}`,
		`{"model":"m","input":[[1,2],[3]]}`,
		`{"model":"m","input":[[1,2],"x"]}`,
		`{"model":"m","input":"x","input":"y"}`,
		"{\n \"model\": \"m\",\n \"input\": [ \"a\" ]\n}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := parserInvariants(t, ParseEmbeddings, body)
		if ok && (r.MaxTokens != 0 || r.Stream) {
			t.Fatalf("an embedding writes nothing: %+v", r)
		}
	})
}
