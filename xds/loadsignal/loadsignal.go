// Package loadsignal reads a model server's own view of its load from its
// Prometheus /metrics, in vLLM's names: requests waiting for a batch slot,
// requests running, and KV-cache usage. The SLA controller judges a pool's
// queue depth from it, which moves before latency does.
package loadsignal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Load is one scrape of a pool, summed over its endpoints.
type Load struct {
	At      time.Time
	Waiting float64 // vllm:num_requests_waiting
	Running float64 // vllm:num_requests_running
	// KVCacheUsage is the mean over endpoints, 0..1
	// (vllm:kv_cache_usage_perc; vllm:gpu_cache_usage_perc before vLLM 0.10).
	KVCacheUsage float64
}

// maxBody bounds a scrape; a model server's /metrics is tens of KB.
const maxBody = 4 << 20

// Scrape fetches each URL and sums the load. An endpoint that fails fails
// the scrape: a partial sum would understate the queue.
func Scrape(ctx context.Context, client *http.Client, urls []string) (Load, error) {
	l := Load{At: time.Now()}
	if len(urls) == 0 {
		return l, errors.New("loadsignal: no URLs")
	}
	var kv float64
	for _, u := range urls {
		one, err := scrapeOne(ctx, client, u)
		if err != nil {
			return Load{}, err
		}
		l.Waiting += one.Waiting
		l.Running += one.Running
		kv += one.KVCacheUsage
	}
	l.KVCacheUsage = kv / float64(len(urls))
	return l, nil
}

func scrapeOne(ctx context.Context, client *http.Client, url string) (Load, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Load{}, fmt.Errorf("loadsignal: %w", err)
	}
	req.Header.Set("accept", "text/plain;version=0.0.4")
	resp, err := client.Do(req)
	if err != nil {
		return Load{}, fmt.Errorf("loadsignal: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Load{}, fmt.Errorf("loadsignal: %s: status %d", url, resp.StatusCode)
	}
	return Parse(io.LimitReader(resp.Body, maxBody))
}

// Parse reads the vLLM load gauges from Prometheus text. Series of the same
// name (one per model or engine) are summed; absent gauges are 0.
func Parse(r io.Reader) (Load, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Load{}, fmt.Errorf("loadsignal: %w", err)
	}
	l := Load{
		Waiting: sum(fams["vllm:num_requests_waiting"]),
		Running: sum(fams["vllm:num_requests_running"]),
	}
	if f := fams["vllm:kv_cache_usage_perc"]; f != nil {
		l.KVCacheUsage = sum(f)
	} else {
		l.KVCacheUsage = sum(fams["vllm:gpu_cache_usage_perc"])
	}
	return l, nil
}

func sum(f *dto.MetricFamily) float64 {
	var s float64
	for _, m := range f.GetMetric() {
		switch {
		case m.GetGauge() != nil:
			s += m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			s += m.GetUntyped().GetValue()
		}
	}
	return s
}
