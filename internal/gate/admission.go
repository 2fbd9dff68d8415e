package gate

import (
	"cmp"
	"errors"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// The one builder of request.Admission: what an adapter read of a request
// (its headers, lower-case names, one value each; the proxy's metadata;
// its body) becomes what the policy is asked. Both adapters call it: the
// ext_proc gate (extproc) and the dynamic module (module).

// Intake reads requests as the gate is configured to.
type Intake struct {
	// CompletionPaths are the paths whose JSON body the gate parses and
	// validates; a path among them that names no API is read as a chat.
	CompletionPaths []string
	MaxBodyBytes    int // a larger body is refused (413)
}

// MaxModelBytes bounds the model name a request may carry: it becomes a
// routing header, a stamp field, a policy input and a cache key, so a
// longer one is refused (400) before anything stores it. Model ids in use
// (e.g. "meta-llama/Llama-3.1-70B-Instruct") are far shorter.
const MaxModelBytes = 256

// CredentialHeaders carry the client's gateway credential (identity reads
// them); they are removed before the request leaves for a pool.
var CredentialHeaders = []string{"authorization", "x-api-key"}

var reservedUnderscorePrefix = strings.ReplaceAll(request.ReservedHeaderPrefix, "-", "_")

// Reserved reports whether a header name (lower-case) is one only the gate
// sets: request.ReservedHeaderPrefix under either spelling (a proxy in
// front of Envoy may translate underscores).
func Reserved(name string) bool {
	return strings.HasPrefix(name, request.ReservedHeaderPrefix) || strings.HasPrefix(name, reservedUnderscorePrefix)
}

// Spoofed lists the client's reserved headers in h.
func Spoofed(h map[string]string) []string {
	var out []string
	for k := range h {
		if Reserved(k) {
			out = append(out, k)
		}
	}
	return out
}

// Headless is what the policy is asked about a request from its headers
// and metadata alone, before its body (Identify), and the client's
// reserved headers (spoofed), which are not the policy's to read.
func (in Intake) Headless(h map[string]string, md map[string]map[string]any) (adm *request.Admission, spoofed []string) {
	path, _, _ := strings.Cut(h[":path"], "?")
	adm = &request.Admission{
		RequestID:  request.Truncate(h["x-request-id"], request.MaxStampField), // a client may set it
		Method:     h[":method"],
		Path:       path,
		Headers:    h,
		Completion: slices.Contains(in.CompletionPaths, path),
		Metadata:   md,
	}
	if adm.Completion {
		adm.API = cmp.Or(openai.APIOf(path), openai.APIChat)
	}
	if spoofed = Spoofed(h); len(spoofed) > 0 {
		adm.Headers = maps.Clone(h)
		for _, k := range spoofed {
			delete(adm.Headers, k)
		}
	}
	return adm, spoofed
}

// Admission is what the policy is asked about the request, body included,
// and the request headers to remove before it leaves: the client's
// reserved ones and its gateway credential. An inference request must be
// well-formed before anything else looks at it (an error: refused,
// adm.Request partial; adm.API set).
func (in Intake) Admission(h map[string]string, md map[string]map[string]any, body []byte) (adm *request.Admission, removed []string, verr *openai.Error) {
	adm, spoofed := in.Headless(h, md)
	adm.Body = body
	if adm.Completion {
		if adm.Request, verr = in.validate(adm.API, adm.Path, adm.Method, h, body); verr != nil {
			return adm, nil, verr
		}
		adm.PromptTokens = adm.Request.PromptTokens
	}
	// The client's gateway credential stops here: a pool (or a hosted
	// API's access log) never receives it.
	removed = spoofed
	for _, k := range CredentialHeaders {
		if _, ok := h[k]; ok {
			removed = append(removed, k)
		}
	}
	return adm, removed, nil
}

// validate checks an inference request is one the gate can decide on, as
// its API reads it. The returned Request is partial when an error is
// returned.
func (in Intake) validate(api openai.API, path, method string, h map[string]string, body []byte) (openai.Request, *openai.Error) {
	if method != http.MethodPost {
		return openai.Request{}, openai.NewError(http.StatusMethodNotAllowed, openai.TypeInvalidRequest, "method_not_allowed", "",
			"method "+method+" is not allowed on "+path+"; use POST")
	}
	if mt, _, err := mime.ParseMediaType(h["content-type"]); err != nil || mt != "application/json" {
		return openai.Request{}, openai.NewError(http.StatusUnsupportedMediaType, openai.TypeInvalidRequest, "unsupported_media_type", "",
			"content-type must be application/json")
	}
	if len(body) > in.MaxBodyBytes {
		return openai.Request{}, TooLarge(len(body), in.MaxBodyBytes)
	}
	req, err := openai.Parse(api, body)
	var fe *openai.FieldError
	switch {
	case err == nil && len(req.Model) > MaxModelBytes:
		return openai.Request{}, openai.BadRequest("invalid_value", "model",
			"model is "+strconv.Itoa(len(req.Model))+" bytes long; the limit is "+strconv.Itoa(MaxModelBytes))
	case err == nil && !HeaderSafe(req.Model):
		// It becomes the routing header: Envoy would refuse the gate's
		// mutation (503 header_mutation_set_contains_invalid_character)
		// after the policy reserved. Refused here, before anything is.
		return openai.Request{}, openai.BadRequest("invalid_value", "model",
			"model must be UTF-8 text without control characters")
	case err == nil:
		return req, nil
	case errors.Is(err, openai.ErrMissingModel):
		return req, openai.BadRequest("missing_model", "model", "you must provide a model parameter")
	case errors.As(err, &fe):
		return req, openai.BadRequest("invalid_value", fe.Param, fe.Error())
	case errors.Is(err, openai.ErrTooDeep):
		return req, openai.BadRequest("invalid_json", "", err.Error())
	default:
		return req, openai.BadRequest("invalid_json", "", "request body is not valid JSON: "+err.Error())
	}
}

// TooLarge is the refusal of a body of n bytes past the limit.
func TooLarge(n, limit int) *openai.Error {
	return openai.NewError(http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, "request_too_large", "",
		"request body is "+strconv.Itoa(n)+" bytes; the limit is "+strconv.Itoa(limit))
}

// HeaderSafe reports whether s may go in a header the gate sets: UTF-8
// with no control character (C0, DEL, C1). Stricter than what Envoy
// accepts in a header value (any byte but C0 controls other than HTAB, and
// DEL), so that nothing the gate admits is refused by Envoy afterwards; a
// model name has no use for either.
func HeaderSafe(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
