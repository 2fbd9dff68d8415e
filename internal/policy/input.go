package policy

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Object keys of the input, built once: terms are immutable once built, so
// every input shares them.
var (
	keyPrincipal             = ast.StringTerm("principal")
	keyID                    = ast.StringTerm("id")
	keyType                  = ast.StringTerm("type")
	keyClaims                = ast.StringTerm("claims")
	keyTenant                = ast.StringTerm("tenant")
	keyLabels                = ast.StringTerm("labels")
	keyRequest               = ast.StringTerm("request")
	keyMethod                = ast.StringTerm("method")
	keyPath                  = ast.StringTerm("path")
	keyAPI                   = ast.StringTerm("api")
	keyPreviousResponseID    = ast.StringTerm("previous_response_id")
	keyBackground            = ast.StringTerm("background")
	keyConversation          = ast.StringTerm("conversation")
	keyPromptID              = ast.StringTerm("prompt_id")
	keyStore                 = ast.StringTerm("store")
	keyHeaders               = ast.StringTerm("headers")
	keyModel                 = ast.StringTerm("model")
	keyVirtualModel          = ast.StringTerm("virtual_model")
	keyStream                = ast.StringTerm("stream")
	keyMaxTokens             = ast.StringTerm("max_tokens")
	keyChoices               = ast.StringTerm("choices")
	keyEstimatedPromptTokens = ast.StringTerm("estimated_prompt_tokens")
	keyUsage                 = ast.StringTerm("usage")
	keyRequests              = ast.StringTerm("requests")
	keyTokens                = ast.StringTerm("tokens")
	keyBudgetMonth           = ast.StringTerm("budget_month")
	keyCost                  = ast.StringTerm("cost")
	keyCurrency              = ast.StringTerm("currency")
	keyPriced                = ast.StringTerm("priced")
	keyPrice                 = ast.StringTerm("price")
	keyInput                 = ast.StringTerm("input")
	keyCachedInput           = ast.StringTerm("cached_input")
	keyCacheWriteInput       = ast.StringTerm("cache_write_input")
	keyOutput                = ast.StringTerm("output")
	keyReservation           = ast.StringTerm("reservation")
	keyInputTokensIn         = ast.StringTerm("input_tokens")
	keyOutputTokensIn        = ast.StringTerm("output_tokens")
)

// Value returns the input as the policy sees it, built directly as an OPA
// value (no JSON round trip on the hot path). It is the value that
// json.Marshal(in) decodes to, so a decision log of the JSON replays the
// same in `opa eval`: nil maps are null, strings that are not valid UTF-8
// have each bad byte replaced by U+FFFD, claims of other Go types take
// their JSON form. The exceptions are values json.Marshal rejects: a NaN or
// infinite claim becomes null, an invalid json.Number a string, a value
// that fails to marshal (or nests deeper than 10000) null.
func (in *Input) Value() ast.Value {
	if in == nil {
		return ast.NullValue
	}
	return ast.NewObject(
		ast.Item(keyPrincipal, in.Principal.term()),
		ast.Item(keyTenant, stringTerm(in.Tenant)),
		ast.Item(keyLabels, stringMapTerm(in.Labels)),
		ast.Item(keyRequest, in.Request.term()),
		ast.Item(keyUsage, ast.ObjectTerm(
			ast.Item(keyRequests, ast.InternedTerm(in.Usage.Requests)),
			ast.Item(keyTokens, ast.InternedTerm(in.Usage.Tokens)),
		)),
		ast.Item(keyCost, in.Cost.term()),
	)
}

func (c *Cost) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyCurrency, stringTerm(c.Currency)),
		ast.Item(keyPriced, ast.InternedTerm(c.Priced)),
		ast.Item(keyPrice, ast.ObjectTerm(
			ast.Item(keyInput, ast.InternedTerm(c.Price.Input)),
			ast.Item(keyCachedInput, ast.InternedTerm(c.Price.CachedInput)),
			ast.Item(keyCacheWriteInput, ast.InternedTerm(c.Price.CacheWriteInput)),
			ast.Item(keyOutput, ast.InternedTerm(c.Price.Output)),
		)),
		ast.Item(keyReservation, ast.ObjectTerm(
			ast.Item(keyInputTokensIn, ast.InternedTerm(c.Reservation.InputTokens)),
			ast.Item(keyOutputTokensIn, ast.InternedTerm(c.Reservation.OutputTokens)),
			ast.Item(keyCost, ast.InternedTerm(c.Reservation.Cost)),
		)),
	)
}

func (p *Principal) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyID, stringTerm(p.ID)),
		ast.Item(keyType, stringTerm(p.Type)),
		ast.Item(keyClaims, anyMapTerm(p.Claims, 0)),
		ast.Item(keyBudgetMonth, ast.InternedTerm(p.BudgetMonth)),
	)
}

func (r *Request) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(keyMethod, stringTerm(r.Method)),
		ast.Item(keyPath, stringTerm(r.Path)),
		ast.Item(keyAPI, stringTerm(r.API)),
		ast.Item(keyHeaders, stringMapTerm(r.Headers)),
		ast.Item(keyModel, stringTerm(r.Model)),
		ast.Item(keyVirtualModel, stringTerm(r.VirtualModel)),
		ast.Item(keyStream, ast.InternedTerm(r.Stream)),
		ast.Item(keyMaxTokens, ast.InternedTerm(r.MaxTokens)),
		ast.Item(keyChoices, ast.InternedTerm(r.Choices)),
		ast.Item(keyEstimatedPromptTokens, ast.InternedTerm(r.EstimatedPromptTokens)),
		ast.Item(keyPreviousResponseID, stringTerm(r.PreviousResponseID)),
		ast.Item(keyBackground, ast.InternedTerm(r.Background)),
		ast.Item(keyConversation, stringTerm(r.Conversation)),
		ast.Item(keyPromptID, stringTerm(r.PromptID)),
		ast.Item(keyStore, ast.InternedTerm(r.Store)),
	)
}

// stringTerm is s as JSON carries it: encoding/json writes each byte that
// is not part of valid UTF-8 as U+FFFD.
func stringTerm(s string) *ast.Term {
	return ast.StringTerm(jsonString(s))
}

func jsonString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// sortedKeys returns m's keys in the order encoding/json writes them when
// some key is not valid UTF-8 (two such keys can then collide, and the one
// written last wins when the JSON is read back), or nil when every key is
// valid and the order does not matter.
func sortedKeys[V any](m map[string]V) []string {
	for k := range m {
		if !utf8.ValidString(k) {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			return keys
		}
	}
	return nil
}

func stringMapTerm(m map[string]string) *ast.Term {
	if m == nil {
		return ast.NullTerm()
	}
	obj := ast.NewObjectWithCapacity(len(m))
	if keys := sortedKeys(m); keys != nil {
		for _, k := range keys {
			obj.Insert(stringTerm(k), stringTerm(m[k]))
		}
	} else {
		for k, v := range m {
			obj.Insert(ast.StringTerm(k), stringTerm(v))
		}
	}
	return ast.NewTerm(obj)
}

// maxDepth bounds the nesting of claims, as encoding/json bounds what it
// decodes; deeper values (or a cycle) become null rather than exhausting
// the stack.
const maxDepth = 10000

func anyMapTerm(m map[string]any, depth int) *ast.Term {
	if m == nil {
		return ast.NullTerm()
	}
	obj := ast.NewObjectWithCapacity(len(m))
	if keys := sortedKeys(m); keys != nil {
		for _, k := range keys {
			obj.Insert(stringTerm(k), anyTerm(m[k], depth+1))
		}
	} else {
		for k, v := range m {
			obj.Insert(ast.StringTerm(k), anyTerm(v, depth+1))
		}
	}
	return ast.NewTerm(obj)
}

// anyTerm converts a claim value. The types encoding/json decodes to are
// handled directly, as are the other common scalar types; anything else
// takes its JSON form.
func anyTerm(v any, depth int) *ast.Term {
	if depth > maxDepth {
		return ast.NullTerm()
	}
	switch v := v.(type) {
	case nil:
		return ast.NullTerm()
	case string:
		return stringTerm(v)
	case bool:
		return ast.InternedTerm(v)
	case float64:
		return floatTerm(v, 64)
	case float32:
		return floatTerm(float64(v), 32)
	case int:
		return ast.InternedTerm(v)
	case int8:
		return ast.InternedTerm(v)
	case int16:
		return ast.InternedTerm(v)
	case int32:
		return ast.InternedTerm(v)
	case int64:
		return ast.InternedTerm(v)
	case uint:
		return ast.NumberTerm(json.Number(strconv.FormatUint(uint64(v), 10)))
	case uint8:
		return ast.InternedTerm(int(v))
	case uint16:
		return ast.InternedTerm(int(v))
	case uint32:
		return ast.NumberTerm(json.Number(strconv.FormatUint(uint64(v), 10)))
	case uint64:
		return ast.NumberTerm(json.Number(strconv.FormatUint(v, 10)))
	case json.Number:
		if v == "" {
			return ast.InternedTerm(0) // encoding/json writes an empty Number as 0
		}
		if !validNumber(string(v)) {
			return ast.StringTerm(jsonString(string(v)))
		}
		return ast.NumberTerm(v)
	case map[string]any:
		return anyMapTerm(v, depth)
	case []any:
		if v == nil {
			return ast.NullTerm()
		}
		terms := make([]*ast.Term, len(v))
		for i, e := range v {
			terms[i] = anyTerm(e, depth+1)
		}
		return ast.ArrayTerm(terms...)
	case map[string]string:
		return stringMapTerm(v)
	case []string:
		if v == nil {
			return ast.NullTerm()
		}
		terms := make([]*ast.Term, len(v))
		for i, e := range v {
			terms[i] = stringTerm(e)
		}
		return ast.ArrayTerm(terms...)
	}
	// Other types (structs, typed slices and maps, json.RawMessage, ...):
	// their JSON form, as json.Marshal(in) would write them.
	val, err := ast.InterfaceToValue(v)
	if err != nil {
		return ast.NullTerm()
	}
	return ast.NewTerm(val)
}

// floatTerm formats f as encoding/json does; JSON has no NaN or infinity.
func floatTerm(f float64, bits int) *ast.Term {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return ast.NullTerm()
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return ast.InternedTerm(int64(f))
	}
	return ast.NumberTerm(json.Number(strconv.FormatFloat(f, 'g', -1, bits)))
}

// validNumber reports whether s is a JSON number literal, as encoding/json
// requires of a json.Number it writes.
func validNumber(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '-' {
		s = s[1:]
		if s == "" {
			return false
		}
	}
	switch {
	case s[0] == '0':
		s = s[1:]
	case '1' <= s[0] && s[0] <= '9':
		s = s[1:]
		for len(s) > 0 && '0' <= s[0] && s[0] <= '9' {
			s = s[1:]
		}
	default:
		return false
	}
	if len(s) >= 2 && s[0] == '.' && '0' <= s[1] && s[1] <= '9' {
		s = s[2:]
		for len(s) > 0 && '0' <= s[0] && s[0] <= '9' {
			s = s[1:]
		}
	}
	if len(s) >= 2 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		if s[0] == '+' || s[0] == '-' {
			s = s[1:]
			if s == "" {
				return false
			}
		}
		for len(s) > 0 && '0' <= s[0] && s[0] <= '9' {
			s = s[1:]
		}
	}
	return s == ""
}
