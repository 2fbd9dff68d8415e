package openai

import (
	"encoding/json"
	"net/http"
)

// Error is an OpenAI-style error, the body every infergate denial carries:
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
type Error struct {
	Status  int     `json:"-"`
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// Error types used by OpenAI's API.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeAuthentication = "authentication_error"
	TypePermission     = "permission_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
)

// JSON renders the error body.
func (e *Error) JSON() []byte {
	b, _ := json.Marshal(struct {
		Error *Error `json:"error"`
	}{e})
	return b
}

func (e *Error) Error() string { return e.Message }

// AnthropicJSON renders the error as Anthropic's API does, for clients of
// its Messages API: {"type":"error","error":{"type":...,"message":...}},
// the type by the status (Anthropic's error types are per status).
func (e *Error) AnthropicJSON() []byte {
	type detail struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error detail `json:"error"`
	}{"error", detail{anthropicType(e.Status), e.Message}})
	return b
}

// anthropicType is Anthropic's error type for an HTTP status.
func anthropicType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// NewError builds an error; param may be empty.
func NewError(status int, typ, code, param, msg string) *Error {
	e := &Error{Status: status, Message: msg, Type: typ, Code: code}
	if param != "" {
		e.Param = &param
	}
	return e
}

// BadRequest is a 400 invalid_request_error.
func BadRequest(code, param, msg string) *Error {
	return NewError(http.StatusBadRequest, TypeInvalidRequest, code, param, msg)
}

// UnknownURL is OpenAI's answer for a path it does not serve.
func UnknownURL(method, path string) *Error {
	return NewError(http.StatusNotFound, TypeInvalidRequest, "unknown_url", "", "Invalid URL ("+method+" "+path+")")
}
