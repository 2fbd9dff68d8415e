package gate

import (
	"slices"
	"testing"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

var intake = Intake{CompletionPaths: []string{"/v1/chat/completions", "/v1/custom"}, MaxBodyBytes: 64}

func TestIntakeAdmission(t *testing.T) {
	h := map[string]string{":method": "POST", ":path": "/v1/chat/completions?x=1", "content-type": "application/json",
		"authorization": "Bearer k", "x-infergate-model": "spoofed", "x_infergate_pool": "spoofed", "x-request-id": "r"}
	adm, removed, verr := intake.Admission(h, nil, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if verr != nil {
		t.Fatal(verr)
	}
	if adm.Path != "/v1/chat/completions" || adm.API != openai.APIChat || !adm.Completion || adm.Request.Model != "m" || adm.RequestID != "r" {
		t.Errorf("admission = %+v", adm)
	}
	slices.Sort(removed)
	if want := []string{"authorization", "x-infergate-model", "x_infergate_pool"}; !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	if _, ok := adm.Headers[request.ModelHeader]; ok {
		t.Error("the policy reads the client's reserved header")
	}
	if h[request.ModelHeader] != "spoofed" {
		t.Error("the adapter's headers were changed")
	}
}

func TestIntakeRefusals(t *testing.T) {
	post := func(path, ct string) map[string]string {
		return map[string]string{":method": "POST", ":path": path, "content-type": ct}
	}
	for _, c := range []struct {
		name string
		h    map[string]string
		body string
		code string
		api  openai.API
	}{
		{"get", map[string]string{":method": "GET", ":path": "/v1/chat/completions"}, "", "method_not_allowed", openai.APIChat},
		{"type", post("/v1/chat/completions", "text/plain"), `{}`, "unsupported_media_type", openai.APIChat},
		{"large", post("/v1/chat/completions", "application/json"), `{"model":"` + string(make([]byte, 64)) + `"}`, "request_too_large", openai.APIChat},
		{"json", post("/v1/chat/completions", "application/json"), `{"model":`, "invalid_json", openai.APIChat},
		{"no model", post("/v1/chat/completions", "application/json"), `{"messages":[]}`, "missing_model", openai.APIChat},
		{"control", post("/v1/chat/completions", "application/json"), `{"model":"a\u0007b","messages":[{"role":"user","content":"x"}]}`, "invalid_value", openai.APIChat},
		{"unnamed path reads as chat", post("/v1/custom", "application/json"), `{"model":`, "invalid_json", openai.APIChat},
	} {
		adm, _, verr := intake.Admission(c.h, nil, []byte(c.body))
		if verr == nil || verr.Code != c.code || adm.API != c.api {
			t.Errorf("%s: %v, api %q; want %s", c.name, verr, adm.API, c.code)
		}
	}
	// Not an inference path: nothing to validate, nothing parsed.
	adm, _, verr := intake.Admission(map[string]string{":method": "GET", ":path": "/v1/models"}, nil, nil)
	if verr != nil || adm.Completion || adm.API != "" {
		t.Errorf("/v1/models: %+v %v", adm, verr)
	}
}
