package openai

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestErrorJSON(t *testing.T) {
	tests := []struct {
		name       string
		err        *Error
		wantStatus int
		want       string
	}{
		{
			name:       "bad request with param",
			err:        BadRequest("missing_model", "model", "you must provide a model parameter"),
			wantStatus: http.StatusBadRequest,
			want:       `{"error":{"message":"you must provide a model parameter","type":"invalid_request_error","param":"model","code":"missing_model"}}`,
		},
		{
			name:       "bad request without param",
			err:        BadRequest("invalid_json", "", "request body is not valid JSON"),
			wantStatus: http.StatusBadRequest,
			want:       `{"error":{"message":"request body is not valid JSON","type":"invalid_request_error","param":null,"code":"invalid_json"}}`,
		},
		{
			name:       "rate limit",
			err:        NewError(http.StatusTooManyRequests, TypeRateLimit, "rate_limit_exceeded", "", "Rate limit reached"),
			wantStatus: http.StatusTooManyRequests,
			want:       `{"error":{"message":"Rate limit reached","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`,
		},
		{
			name:       "server error",
			err:        NewError(http.StatusInternalServerError, TypeServer, "gate_misconfigured", "", "oops"),
			wantStatus: http.StatusInternalServerError,
			want:       `{"error":{"message":"oops","type":"server_error","param":null,"code":"gate_misconfigured"}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(tt.err.JSON()); got != tt.want {
				t.Errorf("JSON()\n got %s\nwant %s", got, tt.want)
			}
			if tt.err.Status != tt.wantStatus {
				t.Errorf("Status = %d, want %d", tt.err.Status, tt.wantStatus)
			}
			if tt.err.Error() != tt.err.Message {
				t.Errorf("Error() = %q, want the message %q", tt.err.Error(), tt.err.Message)
			}
		})
	}
}

// A message built from client input (a path, a field error) must still give
// a well-formed body that decodes back to the same text.
func TestErrorJSONEscapes(t *testing.T) {
	msg := "Invalid URL (POST /v1/\"x\"<y>&z\n\u2028\xff)"
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Param   *string `json:"param"`
		} `json:"error"`
	}
	b := BadRequest("unknown_url", "", msg).JSON()
	if !json.Valid(b) {
		t.Fatalf("JSON() = %s: not valid JSON", b)
	}
	if err := json.Unmarshal(b, &body); err != nil {
		t.Fatal(err)
	}
	if want := "Invalid URL (POST /v1/\"x\"<y>&z\n\u2028\uFFFD)"; body.Error.Message != want {
		t.Errorf("message = %q, want %q", body.Error.Message, want)
	}
	if body.Error.Param != nil {
		t.Errorf("param = %q, want null", *body.Error.Param)
	}
}
