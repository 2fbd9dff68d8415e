package gate

import (
	"context"
	"testing"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// embeddingsOnly permits one model, and only on the embeddings API.
type embeddingsOnly struct{ request.AllowAll }

func (embeddingsOnly) Permits(_ context.Context, a *request.Admission) bool {
	return a.Request.Model == "e" && a.API == openai.APIEmbeddings
}

// The listing without Envoy: which requests it answers, and what a caller
// is listed (a model it may call on any of the gate's APIs, and no other).
func TestCatalog(t *testing.T) {
	c := Catalog{Models: []string{"m", "e", "org/llama"}, CompletionPaths: []string{"/v1/chat/completions", "/v1/embeddings"}}
	for _, tc := range []struct {
		method, path string
		id           string
		one, ok      bool
	}{
		{"GET", "/v1/models", "", false, true},
		{"GET", "/v1/models/org%2Fllama", "org/llama", true, true},
		{"GET", "/v1/models/org/llama", "org/llama", true, true},
		{"GET", "/v1/models/", "", false, false},
		{"POST", "/v1/models", "", false, false},
		{"GET", "/v1/modelsx", "", false, false},
	} {
		id, one, ok := c.Request(tc.method, tc.path)
		if id != tc.id || one != tc.one || ok != tc.ok {
			t.Errorf("Request(%s %s) = %q, %v, %v; want %q, %v, %v", tc.method, tc.path, id, one, ok, tc.id, tc.one, tc.ok)
		}
	}
	if _, _, ok := (Catalog{}).Request("GET", "/v1/models"); ok {
		t.Error("an empty catalog answers the listing")
	}
	ctx, adm := context.Background(), &request.Admission{RequestID: "r", Method: "GET", Path: ModelsPath}
	if got := string(c.List(ctx, embeddingsOnly{}, adm)); got != `{"object":"list","data":[{"id":"e","object":"model","created":1735689600,"owned_by":"infergate"}]}` {
		t.Errorf("listing %s", got)
	}
	if _, ok := c.One(ctx, embeddingsOnly{}, adm, "m"); ok {
		t.Error("a model the caller may not call is retrieved")
	}
	if _, ok := c.One(ctx, request.AllowAll{}, adm, "x"); ok {
		t.Error("a model outside the catalog is retrieved")
	}
	if body, ok := c.One(ctx, request.AllowAll{}, adm, "org/llama"); !ok || string(body) != `{"id":"org/llama","object":"model","created":1735689600,"owned_by":"infergate"}` {
		t.Errorf("retrieved %s, %v", body, ok)
	}
	pools := Catalog{PoolModels: func() []string { return []string{"served"} }}
	if got := string(pools.List(ctx, request.AllowAll{}, adm)); got != `{"object":"list","data":[{"id":"served","object":"model","created":1735689600,"owned_by":"infergate"}]}` {
		t.Errorf("the pools' listing %s", got)
	}
}
