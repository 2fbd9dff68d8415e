package openai

import (
	"math"

	"github.com/tidwall/gjson"
)

// ParseEmbeddings reads a /v1/embeddings body: model, input (a string, an
// array of strings, an array of token IDs, or an array of token-ID
// arrays) and dimensions, with ParseRequest's guarantees (strict JSON, a
// read key at most once, MaxDepth). PromptTokens estimates the input as a
// completion prompt is estimated (text at 4 bytes a token and
// TokensPerPrompt per string, token IDs exactly); an embedding writes no
// output, so MaxTokens is 0.
func ParseEmbeddings(body []byte) (Request, error) {
	var v [len(embeddingKeys)]gjson.Result
	if err := topLevel(body, embeddingKeys[:], v[:]); err != nil {
		return Request{}, err
	}
	var (
		r   Request
		err error
	)
	if r.Model, err = readModel(v[0]); err != nil {
		return Request{}, err
	}
	if err := embeddingInput(v[1]); err != nil {
		return Request{}, err
	}
	if r.Dimensions, err = readPositive("dimensions", v[2]); err != nil {
		return Request{}, err
	}
	var e estimate
	e.prompt(v[1])
	r.PromptChars = e.chars
	r.PromptTokens = e.promptTokens()
	r.MaxPromptTokens = r.maxPrompt(&e, len(body))
	r.Choices = 1
	return r, nil
}

var embeddingKeys = [...]string{"model", "input", "dimensions"}

var errEmbeddingInput = &FieldError{"input", "must be a string, an array of strings, an array of token IDs or an array of token-ID arrays"}

// embeddingInput checks the shape of an embeddings input: one kind of
// element throughout, never empty.
func embeddingInput(in gjson.Result) error {
	switch {
	case in.Type == gjson.Null:
		return &FieldError{"input", "is required"}
	case in.Type == gjson.String:
		return nil
	case !in.IsArray():
		return errEmbeddingInput
	}
	var first gjson.Type
	n := 0
	ok := true
	in.ForEach(func(_, x gjson.Result) bool {
		if n == 0 {
			first = x.Type
		}
		n++
		switch {
		case x.Type != first:
			ok = false
		case x.Type == gjson.String:
		case x.Type == gjson.Number:
			ok = tokenID(x)
		case x.IsArray():
			m := 0
			x.ForEach(func(_, id gjson.Result) bool {
				m++
				ok = tokenID(id)
				return ok
			})
			ok = ok && m > 0
		default:
			ok = false
		}
		return ok
	})
	if !ok || n == 0 {
		return errEmbeddingInput
	}
	return nil
}

// tokenID accepts a JSON integer from 0 to 2³¹-1.
func tokenID(v gjson.Result) bool {
	return v.Type == gjson.Number && v.Num >= 0 && v.Num <= math.MaxInt32 && v.Num == math.Trunc(v.Num)
}
