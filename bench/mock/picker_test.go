package mock

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/synctest"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The Endpoint Picker of the Gateway API Inference Extension (v1.4.0)
// parses /metrics with Prometheus' text parser and reads, per pod, the
// queue, the batch, the KV cache's use and the labels of vLLM's two info
// metrics. Under a load that queues, each is there and true.
func TestEndpointPickerMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(10), ITL: ms(20), MaxBatch: 2, KVCacheTokens: 1000}, nil)
		var dones []<-chan struct{}
		for i := range 5 {
			_, done := call(t.Context(), s, "/v1/chat/completions", streamBody(10, "ten words of prompt "+strconv.Itoa(i)+" a b c d e"), nil)
			dones = append(dones, done)
		}
		synctest.Wait()
		fams := parseMetrics(t, s)
		// Two run, three wait; the two running hold their prompts' 10 tokens each.
		for name, want := range map[string]float64{
			"vllm:num_requests_running": 2, "vllm:num_requests_waiting": 3, "vllm:kv_cache_usage_perc": 0.02,
		} {
			if got := gauge(t, fams, name).GetGauge().GetValue(); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		if got := labels(gauge(t, fams, "vllm:cache_config_info")); got["block_size"] != "16" || got["num_gpu_blocks"] != "62" {
			t.Errorf("vllm:cache_config_info labels %v, want block_size 16 and num_gpu_blocks 1000/16", got)
		}
		lora := gauge(t, fams, "vllm:lora_requests_info")
		if got := labels(lora); got["max_lora"] != "0" || got["running_lora_adapters"] != "" || got["waiting_lora_adapters"] != "" {
			t.Errorf("vllm:lora_requests_info labels %v, want no adapters", got)
		}
		// The picker keeps the series with the largest value: a time, never 0.
		if lora.GetGauge().GetValue() <= 0 {
			t.Errorf("vllm:lora_requests_info = %v, want the time of the last change", lora.GetGauge().GetValue())
		}
		for _, d := range dones {
			<-d
		}
		fams = parseMetrics(t, s)
		for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} {
			if got := gauge(t, fams, name).GetGauge().GetValue(); got != 0 {
				t.Errorf("%s = %v once every request ended, want 0", name, got)
			}
		}
	})
}

func parseMetrics(t *testing.T, s *Server) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v", err)
	}
	return fams
}

// gauge is the one sample of the gauge name.
func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	if !ok || f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) != 1 {
		t.Fatalf("%s: %v, want one gauge sample", name, f)
	}
	return f.GetMetric()[0]
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}
