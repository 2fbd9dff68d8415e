package loadsignal

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const vllm = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="llama"} 1234
`

func TestParse(t *testing.T) {
	l, err := Parse(strings.NewReader(vllm))
	if err != nil {
		t.Fatal(err)
	}
	if l.Waiting != 9 || l.Running != 12 || l.KVCacheUsage != 0.5 {
		t.Errorf("load %+v", l)
	}
	old, err := Parse(strings.NewReader("vllm:gpu_cache_usage_perc 0.25\n"))
	if err != nil || old.KVCacheUsage != 0.25 {
		t.Errorf("older vLLM name: %+v %v", old, err)
	}
	if _, err := Parse(strings.NewReader("vllm:num_requests_waiting{ 1\n")); err == nil {
		t.Error("malformed text parsed")
	}
}

func TestScrapeSumsEndpoints(t *testing.T) {
	var srvs []string
	for i := range 2 {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "vllm:num_requests_waiting %d\nvllm:kv_cache_usage_perc 0.%d\n", i+1, 2*(i+1))
		}))
		defer s.Close()
		srvs = append(srvs, s.URL+"/metrics")
	}
	l, err := Scrape(context.Background(), http.DefaultClient, srvs)
	if err != nil {
		t.Fatal(err)
	}
	if l.Waiting != 3 || l.KVCacheUsage < 0.299 || l.KVCacheUsage > 0.301 || l.At.IsZero() {
		t.Errorf("load %+v", l)
	}
	down := httptest.NewServer(http.NotFoundHandler())
	defer down.Close()
	if _, err := Scrape(context.Background(), http.DefaultClient, append(srvs, down.URL)); err == nil {
		t.Error("a failing endpoint did not fail the scrape")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(vllm)
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = Parse(strings.NewReader(s))
	})
}
