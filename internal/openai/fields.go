package openai

import (
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// topLevel checks body as ParseRequest does (within MaxDepth, valid JSON,
// an object) and sets vals[i] to the value of key names[i] (absent: a zero
// Result). A named key may appear only once: decoders disagree on which
// duplicate wins. The values point into body.
func topLevel(body []byte, names []string, vals []gjson.Result) error {
	if !depthOK(body) {
		return errBodyTooDeep
	}
	if !gjson.ValidBytes(body) {
		return ErrInvalidJSON
	}
	doc := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	if !doc.IsObject() {
		return ErrInvalidJSON
	}
	dup := ""
	doc.ForEach(func(k, v gjson.Result) bool {
		i := slices.Index(names, k.Str)
		switch {
		case i < 0:
		case vals[i].Exists():
			dup = strings.Clone(k.Str) // k.Str may point into body
			return false
		default:
			vals[i] = v
		}
		return true
	})
	if dup != "" {
		return &FieldError{dup, "appears more than once"}
	}
	return nil
}

// readModel is a request's model: a string that is not blank.
func readModel(v gjson.Result) (string, error) {
	switch {
	case v.Type == gjson.Null: // absent or null
		return "", ErrMissingModel
	case v.Type != gjson.String:
		return "", &FieldError{"model", "must be a string"}
	case strings.TrimSpace(v.Str) == "":
		return "", ErrMissingModel
	}
	return strings.Clone(v.Str), nil
}

// readBool is an optional boolean; false when absent or null.
func readBool(name string, v gjson.Result) (bool, error) {
	switch v.Type {
	case gjson.Null:
		return false, nil
	case gjson.True, gjson.False:
		return v.Bool(), nil
	}
	return false, &FieldError{name, "must be a boolean"}
}

// readPositive is an optional positive integer; 0 when absent or null.
func readPositive(name string, v gjson.Result) (int, error) {
	if v.Type == gjson.Null {
		return 0, nil
	}
	n, ok := positiveInt(v)
	if !ok {
		return 0, &FieldError{name, "must be a positive integer"}
	}
	return n, nil
}

// MaxIDBytes bounds an identifier a client sends for the server to look
// up (previous_response_id, conversation, prompt.id): it reaches the policy input and the decision
// memo's key, and real ones are a few dozen bytes.
const MaxIDBytes = 256

// readID is an optional identifier string of at most MaxIDBytes; "" when
// absent or null. An empty one is refused: a server may read it as set
// where the gate reads it as unset.
func readID(name string, v gjson.Result) (string, error) {
	switch {
	case v.Type == gjson.Null:
		return "", nil
	case v.Type != gjson.String || v.Str == "":
		return "", &FieldError{name, "must be a non-empty string"}
	case len(v.Str) > MaxIDBytes:
		return "", &FieldError{name, fmt.Sprintf("must be at most %d bytes", MaxIDBytes)}
	}
	return strings.Clone(v.Str), nil
}

// readTools counts a tools array (null or absent: none).
func (e *estimate) readTools(v gjson.Result) error {
	switch {
	case v.Type == gjson.Null:
		return nil
	case !v.IsArray():
		return &FieldError{"tools", "must be an array"}
	}
	return e.tools("tools", v)
}
