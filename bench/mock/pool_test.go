package mock

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The capacity model's tests run in a synctest bubble against the handler
// itself: the clock is fake, so timings are exact rather than bounded.

type write struct {
	at   time.Time
	data string
}

// recorder is a ResponseWriter noting the bubble time of every write.
type recorder struct {
	mu     sync.Mutex
	header http.Header
	code   int
	writes []write
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.code == 0 {
		r.code = http.StatusOK
	}
	r.writes = append(r.writes, write{time.Now(), string(b)})
	return len(b), nil
}

func (r *recorder) Flush() {}

func (r *recorder) snapshot() (int, []write) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.code, slices.Clone(r.writes)
}

// call serves one request in the background; done closes when the handler
// returns.
func call(ctx context.Context, s *Server, path, body string, hdr map[string]string) (rec *recorder, done <-chan struct{}) {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec = &recorder{header: http.Header{}}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		s.Handler().ServeHTTP(rec, req)
	}()
	return rec, ch
}

// contentTimes returns when each content event was written, since start.
func contentTimes(t *testing.T, rec *recorder, start time.Time) []time.Duration {
	t.Helper()
	_, writes := rec.snapshot()
	var at []time.Duration
	for _, w := range writes {
		data, ok := strings.CutPrefix(w.data, "data: ")
		if !ok || strings.HasPrefix(data, "[DONE]") {
			continue
		}
		if decode(t, data).text() != "" {
			at = append(at, w.at.Sub(start))
		}
	}
	return at
}

// scrape returns the unlabelled samples of the mock's /metrics.
func scrape(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	got := map[string]float64{}
	for line := range strings.Lines(rec.Body.String()) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "#") || strings.Contains(name, "{") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		got[name] = f
	}
	return got
}

func wantGauges(t *testing.T, s *Server, want map[string]float64) {
	t.Helper()
	got := scrape(t, s)
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, v)
		}
	}
}

func streamBody(tokens int, prompt string) string {
	return fmt.Sprintf(`{"model":"mock-model","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, tokens, prompt)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestBatchLimitQueuesFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(10), ITL: ms(20), MaxBatch: 4}, nil)
		start := time.Now()
		var recs []*recorder
		var dones []<-chan struct{}
		for i := range 8 {
			rec, done := call(t.Context(), s, "/v1/chat/completions", streamBody(10, "request "+strconv.Itoa(i)), nil)
			recs, dones = append(recs, rec), append(dones, done)
		}
		synctest.Wait()
		wantGauges(t, s, map[string]float64{"vllm:num_requests_running": 4, "vllm:num_requests_waiting": 4})
		for _, d := range dones {
			<-d
		}
		wantGauges(t, s, map[string]float64{
			"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0, "vllm:kv_cache_usage_perc": 0,
		})

		// The first four finish at 10ms + 9·20ms = 190ms, which admits the
		// other four; their first token follows TTFT later.
		var ttfts []time.Duration
		for _, rec := range recs {
			at := contentTimes(t, rec, start)
			if len(at) != 10 {
				t.Fatalf("%d content events, want 10", len(at))
			}
			ttfts = append(ttfts, at[0])
		}
		slices.Sort(ttfts)
		want := []time.Duration{ms(10), ms(10), ms(10), ms(10), ms(200), ms(200), ms(200), ms(200)}
		if !slices.Equal(ttfts, want) {
			t.Fatalf("TTFTs %v, want %v", ttfts, want)
		}
	})
}

func TestQueueLimitRefuses(t *testing.T) {
	for _, tc := range []struct {
		maxQueue, accepted int
	}{
		{1, 2},  // one running, one waiting
		{-1, 1}, // no waiting room at all
	} {
		t.Run("max_queue="+strconv.Itoa(tc.maxQueue), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := New(Config{TTFT: ms(10), ITL: ms(10), MaxBatch: 1, MaxQueue: tc.maxQueue}, nil)
				for range tc.accepted {
					call(t.Context(), s, "/v1/chat/completions", streamBody(5, "hi"), nil)
				}
				synctest.Wait()
				rec, done := call(t.Context(), s, "/v1/chat/completions", streamBody(5, "hi"), nil)
				<-done
				code, writes := rec.snapshot()
				if code != http.StatusTooManyRequests || rec.header.Get("Retry-After") != "1" {
					t.Fatalf("status %d, Retry-After %q; want 429 with 1", code, rec.header.Get("Retry-After"))
				}
				assertError(t, []byte(writes[0].data), "rate_limit_error", "queue_full")
			})
		})
	}
}

func TestQueuedClientLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(10), ITL: ms(10), MaxBatch: 1}, nil)
		start := time.Now()
		// Waits between the calls fix the arrival order.
		_, first := call(t.Context(), s, "/v1/chat/completions", streamBody(5, "a"), nil)
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		_, gone := call(ctx, s, "/v1/chat/completions", streamBody(5, "b"), nil)
		synctest.Wait()
		rec, third := call(t.Context(), s, "/v1/chat/completions", streamBody(5, "c"), nil)
		synctest.Wait()
		wantGauges(t, s, map[string]float64{"vllm:num_requests_running": 1, "vllm:num_requests_waiting": 2})
		cancel()
		<-gone
		wantGauges(t, s, map[string]float64{"vllm:num_requests_running": 1, "vllm:num_requests_waiting": 1})
		<-first
		<-third
		// The third moved up when the second left: admitted at 50ms.
		if at := contentTimes(t, rec, start); len(at) != 5 || at[0] != ms(60) {
			t.Fatalf("third request's content at %v, want 5 events from 60ms", at)
		}
		wantGauges(t, s, map[string]float64{"vllm:num_requests_running": 0, "vllm:num_requests_waiting": 0})
	})
}

func TestITLGrowsWithBatch(t *testing.T) {
	cfg := Config{TTFT: ms(10), ITL: ms(5), ITLPerBatch: ms(10)}
	gaps := func(t *testing.T, concurrent int) []time.Duration {
		s := New(cfg, nil)
		start := time.Now()
		var recs []*recorder
		var dones []<-chan struct{}
		for i := range concurrent {
			rec, done := call(t.Context(), s, "/v1/chat/completions", streamBody(6, strconv.Itoa(i)), nil)
			recs, dones = append(recs, rec), append(dones, done)
		}
		for _, d := range dones {
			<-d
		}
		var all []time.Duration
		for _, rec := range recs {
			at := contentTimes(t, rec, start)
			for i := 1; i < len(at); i++ {
				all = append(all, at[i]-at[i-1])
			}
		}
		return slices.Compact(all)
	}
	synctest.Test(t, func(t *testing.T) {
		if g := gaps(t, 1); !slices.Equal(g, []time.Duration{ms(5)}) {
			t.Errorf("alone: gaps %v, want 5ms", g)
		}
		// ITL(4) = 5ms + 3·10ms.
		if g := gaps(t, 4); !slices.Equal(g, []time.Duration{ms(35)}) {
			t.Errorf("batch of 4: gaps %v, want 35ms", g)
		}
	})
}

func TestPrefixCacheShortensPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(10), TTFTPerPromptToken: ms(1), ITL: ms(1), PrefixCacheTokens: 1024}, nil)
		words := func(prefix string, n int) string {
			w := make([]string, n)
			for i := range w {
				w[i] = prefix + strconv.Itoa(i)
			}
			return strings.Join(w, " ")
		}
		long := words("w", 40)                                  // 2 full blocks and 8 more tokens
		sharesOneBlock := words("w", 16) + " " + words("x", 24) // first block in common
		ttft := func(prompt string) time.Duration {
			start := time.Now()
			rec, done := call(t.Context(), s, "/v1/chat/completions", streamBody(2, prompt), nil)
			<-done
			return contentTimes(t, rec, start)[0]
		}
		for _, tc := range []struct {
			name, prompt string
			want         time.Duration
		}{
			{"cold", long, ms(10 + 40)},
			{"repeat", long, ms(10 + 8)},
			{"shared first block", sharesOneBlock, ms(10 + 24)},
			{"all blocks cached", words("w", 32), ms(10 + 1)}, // the last token is always computed
		} {
			if got := ttft(tc.prompt); got != tc.want {
				t.Errorf("%s: TTFT %v, want %v", tc.name, got, tc.want)
			}
		}
		wantGauges(t, s, map[string]float64{
			"vllm:prefix_cache_queries_total": 40 + 40 + 40 + 32,
			"vllm:prefix_cache_hits_total":    0 + 32 + 16 + 31,
		})
	})
}

func TestPrefixCacheEvictsTailsFirst(t *testing.T) {
	c := newPrefixCache(2)
	chain := []uint64{1, 2, 3}
	if hits := c.match(chain); hits != 0 {
		t.Fatalf("cold hits %d", hits)
	}
	// A chain longer than the cache keeps its head, not its tail.
	if hits := c.match(chain); hits != 2 {
		t.Fatalf("hits %d, want 2", hits)
	}
	c.match([]uint64{7, 8})
	if hits := c.match(chain); hits != 0 {
		t.Fatalf("hits %d after eviction, want 0", hits)
	}
	if newPrefixCache(0) != nil {
		t.Fatal("a zero-size cache must be off")
	}
}

func TestKVCacheUsage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(10), ITL: ms(10), KVCacheTokens: 100}, nil)
		// 10 prompt words and 10 output tokens, one every 10ms from 10ms.
		_, done := call(t.Context(), s, "/v1/chat/completions", streamBody(10, "a b c d e f g h i j"), nil)
		time.Sleep(ms(55))
		wantGauges(t, s, map[string]float64{"vllm:kv_cache_usage_perc": 0.15, "vllm:num_requests_running": 1})
		<-done
		wantGauges(t, s, map[string]float64{"vllm:kv_cache_usage_perc": 0, "vllm:num_requests_running": 0})
	})
}

func TestNonStreamingHoldsItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(10), ITL: ms(10), ITLPerBatch: ms(10), MaxBatch: 1}, nil)
		body := `{"model":"mock-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
		start := time.Now()
		first, d1 := call(t.Context(), s, "/v1/chat/completions", body, nil)
		second, d2 := call(t.Context(), s, "/v1/chat/completions", body, nil)
		<-d1
		<-d2
		// Alone in the batch each takes 10ms + 2·10ms; the second waits.
		_, w1 := first.snapshot()
		_, w2 := second.snapshot()
		got := []time.Duration{w1[0].at.Sub(start), w2[0].at.Sub(start)}
		slices.Sort(got)
		if want := []time.Duration{ms(30), ms(60)}; !slices.Equal(got, want) {
			t.Fatalf("responses at %v, want %v", got, want)
		}
	})
}

func TestRaisingBatchLimitAdmitsWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{TTFT: ms(10), ITL: ms(10), MaxBatch: 1}, nil)
		for range 3 {
			call(t.Context(), s, "/v1/chat/completions", streamBody(50, "hi"), nil)
		}
		synctest.Wait()
		wantGauges(t, s, map[string]float64{"vllm:num_requests_running": 1, "vllm:num_requests_waiting": 2})
		cfg := s.Config()
		cfg.MaxBatch = 0
		s.SetConfig(cfg)
		wantGauges(t, s, map[string]float64{"vllm:num_requests_running": 3, "vllm:num_requests_waiting": 0})
	})
}
