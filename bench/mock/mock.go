// Package mock implements an OpenAI-compatible mock LLM upstream that emits
// tokens on a fixed, drift-free cadence.
//
// Response bytes are a pure function of the request's semantic content
// (model, messages or prompt, and output length), so end-to-end tests can
// compare bodies byte for byte across gateway paths. Events are scheduled on
// absolute deadlines, and the mock exports its own achieved-cadence error, so
// benchmarks can separate mock lateness from gateway overhead.
package mock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Defaults applied by Config.WithDefaults.
const (
	defaultTTFT           = 50 * time.Millisecond
	defaultITL            = 20 * time.Millisecond
	defaultTokensPerEvent = 1
	defaultMaxTokens      = 64
)

// maxBodyBytes bounds request bodies; prompts in tests and benchmarks are far
// smaller, and an unbounded read would let a runaway client exhaust memory.
const maxBodyBytes = 16 << 20

// Config sets the mock's default cadence. Per-request headers can override
// most of it (see the x-mock-* headers handled by parseParams).
type Config struct {
	TTFT               time.Duration // time from request arrival to first content event (default 50ms)
	TTFTPerPromptToken time.Duration // extra prefill time per prompt token (default 0)
	ITL                time.Duration // gap between content events (default 20ms)
	TokensPerEvent     int           // tokens carried per content event (default 1)
	Jitter             time.Duration // uniform ±jitter added to each deadline (deterministic per request, default 0)
	MaxTokens          int           // output tokens when the request sets no max_tokens / max_completion_tokens (default 64)
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
// Jitter and TTFTPerPromptToken default to zero and are left alone.
//
// Because zero means "use the default", a caller wanting no delay at all
// passes a negative TTFT or ITL (New treats negative durations as zero) or
// sends the x-mock-ttft-ms / x-mock-itl-ms headers with a value of 0.
func (c Config) WithDefaults() Config {
	if c.TTFT == 0 {
		c.TTFT = defaultTTFT
	}
	if c.ITL == 0 {
		c.ITL = defaultITL
	}
	if c.TokensPerEvent == 0 {
		c.TokensPerEvent = defaultTokensPerEvent
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = defaultMaxTokens
	}
	return c
}

// normalized applies defaults and clamps values that have no meaning when
// negative, so the request path never has to re-validate the config.
func (c Config) normalized() Config {
	c = c.WithDefaults()
	c.TTFT = max(c.TTFT, 0)
	c.TTFTPerPromptToken = max(c.TTFTPerPromptToken, 0)
	c.ITL = max(c.ITL, 0)
	c.Jitter = max(c.Jitter, 0)
	if c.TokensPerEvent < 1 {
		c.TokensPerEvent = defaultTokensPerEvent
	}
	if c.MaxTokens < 1 {
		c.MaxTokens = defaultMaxTokens
	}
	c.MaxTokens = min(c.MaxTokens, maxOutputTokens)
	return c
}

// Server is the mock upstream. Create it with New; it is safe for concurrent
// use.
type Server struct {
	cfg     atomic.Pointer[Config] // swapped at runtime through /mock/control
	faults  atomic.Pointer[Faults]
	faultN  atomic.Int64 // completion requests seen by the fault injector
	logger  *slog.Logger
	metrics *metrics
	handler http.Handler
	served  atomic.Int64

	mu         sync.Mutex
	lastHeader http.Header
	lastBody   []byte
}

// New returns a Server using cfg (after WithDefaults). A nil logger discards
// logs.
func New(cfg Config, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		logger:  logger,
		metrics: newMetrics(),
	}
	s.SetConfig(cfg)
	s.faults.Store(&Faults{})
	s.handler = s.routes()
	return s
}

// Handler returns the HTTP handler serving every route of the mock.
func (s *Server) Handler() http.Handler { return s.handler }

// Served reports how many completion requests (chat and legacy completions)
// the server has received, whatever their outcome, including 4xx.
func (s *Server) Served() int64 { return s.served.Load() }

// LastRequest returns copies of the headers and body of the most recent
// completion request. Only completion endpoints are recorded, so that health
// checks and metric scrapes arriving through a gateway cannot overwrite the
// request a test wants to inspect. Both are nil before the first request.
func (s *Server) LastRequest() (http.Header, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastHeader.Clone(), bytes.Clone(s.lastBody)
}

func (s *Server) recordRequest(h http.Header, body []byte) {
	h = h.Clone()
	s.mu.Lock()
	s.lastHeader, s.lastBody = h, body
	s.mu.Unlock()
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	// Method checks happen in the handlers rather than in mux patterns so
	// that a wrong method gets an OpenAI-style JSON error, not the mux's
	// plain-text 405.
	mux.Handle("/v1/chat/completions", s.completionHandler(kindChat))
	mux.Handle("/v1/completions", s.completionHandler(kindText))
	mux.Handle("/v1/models", onlyGet(http.HandlerFunc(handleModels)))
	mux.Handle("/healthz", onlyGet(http.HandlerFunc(handleHealth)))
	mux.Handle("/metrics", onlyGet(promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{})))
	mux.HandleFunc("/mock/control", s.handleControl)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, typeInvalidRequest, "not_found", "unknown route "+r.Method+" "+r.URL.Path)
	})
	return mux
}

func onlyGet(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed",
				"method "+r.Method+" not allowed on "+r.URL.Path)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok"))
}

func handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{
		Object: "list",
		Data:   []model{{ID: "mock-model", Object: "model", Created: 0, OwnedBy: "infergate-mock"}},
	})
}

func (s *Server) completionHandler(k kind) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, stream := s.serveCompletion(w, r, k)
		s.metrics.requests.WithLabelValues(k.label(), strconv.FormatBool(stream), strconv.Itoa(code)).Inc()
	})
}

// statusClientClosed is recorded (never sent) when a non-streaming client
// leaves before its response is due; it follows the nginx convention.
const statusClientClosed = 499

// serveCompletion handles one completion request and reports the status it
// produced and whether the request asked to stream, for the request counter.
func (s *Server) serveCompletion(w http.ResponseWriter, r *http.Request, k kind) (code int, stream bool) {
	body, readErr := readBody(w, r)
	// t0 is taken after the body is read so that the configured TTFT is
	// measured from the moment the mock could start work, independent of how
	// fast the gateway forwarded the body.
	t0 := time.Now()
	s.recordRequest(r.Header, body)
	s.served.Add(1)

	if readErr != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(readErr, &tooLarge) {
			return writeError(w, http.StatusRequestEntityTooLarge, typeInvalidRequest, "request_too_large", readErr.Error()), false
		}
		return writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_body", "reading request body: "+readErr.Error()), false
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed",
			"method "+r.Method+" not allowed on "+r.URL.Path), false
	}
	p, err := s.parseParams(r.Header)
	if err != nil {
		return writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_header", err.Error()), false
	}
	req, apiErr := parseRequest(body)
	if apiErr != nil {
		return writeError(w, http.StatusBadRequest, typeInvalidRequest, apiErr.code, apiErr.message), req.Stream
	}
	if p.status == 0 {
		p.status = s.injectFault()
	}
	if p.status != 0 {
		typ, code := injectedErrorKind(p.status)
		return writeError(w, p.status, typ, code, "mock: injected status "+strconv.Itoa(p.status)), req.Stream
	}
	c, apiErr := newCompletion(k, req, p, *s.cfg.Load(), t0)
	if apiErr != nil {
		return writeError(w, http.StatusBadRequest, typeInvalidRequest, apiErr.code, apiErr.message), req.Stream
	}
	if req.Stream {
		s.stream(r.Context(), w, c)
		return http.StatusOK, true
	}
	return s.complete(r.Context(), w, c), false
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	var buf bytes.Buffer
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	return buf.Bytes(), err
}

// injectedErrorKind picks the OpenAI error type and code a real upstream
// would send with status, so gateway error mapping sees realistic bodies.
func injectedErrorKind(status int) (typ, code string) {
	switch {
	case status == http.StatusTooManyRequests:
		return typeRateLimit, "rate_limit_exceeded"
	case status >= 500:
		return typeServer, "mock_injected_error"
	default:
		return typeInvalidRequest, "mock_injected_error"
	}
}

// stream writes c as server-sent events on its absolute schedule.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, c *completion) {
	s.metrics.activeStreams.Inc()
	defer s.metrics.activeStreams.Dec()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sw := newSSEWriter(w)

	// Chat streams open with a role-only chunk at t0, as OpenAI and vLLM do;
	// legacy completions have none, so flush the headers alone so the client
	// still sees the response start at t0.
	var err error
	if c.kind == kindChat {
		err = sw.send(c.roleChunk())
	} else {
		err = sw.flush()
	}
	if err != nil {
		s.clientGone(c, 0, err)
		return
	}

	timer := time.NewTimer(math.MaxInt64)
	defer timer.Stop()
	words := c.words()
	events := c.events()
	for k := range events {
		deadline := c.sched.deadline(k)
		if err := sleepUntil(ctx, timer, deadline); err != nil {
			s.clientGone(c, k, err)
			return
		}
		n := min(c.tokensPerEvent, c.outputTokens-k*c.tokensPerEvent)
		if err := sw.send(c.contentChunk(words.next(n))); err != nil {
			s.clientGone(c, k, err)
			return
		}
		// Measured after the flush: that is when the bytes left the mock,
		// which is what a downstream meter can observe.
		s.metrics.lateness.Observe(time.Since(deadline).Seconds())
	}

	err = sw.send(c.finishChunk())
	if err == nil && c.includeUsage {
		err = sw.send(c.usageChunk())
	}
	if err == nil {
		err = sw.write([]byte("data: [DONE]\n\n"))
	}
	if err != nil {
		s.clientGone(c, events, err)
	}
}

// complete writes c as a single JSON body once its last token would have
// been emitted, so non-streaming latency matches the streaming total.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, c *completion) int {
	timer := time.NewTimer(math.MaxInt64)
	defer timer.Stop()
	if err := sleepUntil(ctx, timer, c.sched.deadline(c.events()-1)); err != nil {
		s.clientGone(c, 0, err)
		return statusClientClosed
	}
	return writeJSON(w, http.StatusOK, c.fullResponse())
}

func (s *Server) clientGone(c *completion, eventsSent int, err error) {
	s.logger.Debug("mock: client went away",
		"endpoint", c.kind.label(), "id", c.id, "events_sent", eventsSent, "err", err)
}

// sleepUntil blocks until deadline or until ctx is done. Sleeping to an
// absolute deadline, rather than for a fixed interval after the previous
// write, keeps per-event errors from accumulating into drift.
func sleepUntil(ctx context.Context, timer *time.Timer, deadline time.Time) error {
	d := time.Until(deadline)
	if d <= 0 {
		// Already due (zero-delay benchmarks take this path every event):
		// skip the timer but still notice a departed client.
		return ctx.Err()
	}
	timer.Reset(d)
	select {
	case <-ctx.Done():
		timer.Stop()
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// sseWriter frames server-sent events and flushes each one immediately.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// send writes v as one "data: <json>\n\n" event.
func (s *sseWriter) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.buf = append(s.buf[:0], "data: "...)
	s.buf = append(s.buf, b...)
	s.buf = append(s.buf, "\n\n"...)
	return s.write(s.buf)
}

func (s *sseWriter) write(b []byte) error {
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.flush()
}

func (s *sseWriter) flush() error {
	// A writer that cannot flush still delivers the bytes eventually; only
	// real I/O errors should end the stream.
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// metrics lives on a private registry so that several Servers (one per test)
// never collide and the gateway's own metrics stay separate.
type metrics struct {
	registry      *prometheus.Registry
	requests      *prometheus.CounterVec
	lateness      prometheus.Histogram
	activeStreams prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_mock_requests_total",
			Help: "Completion requests received by the mock upstream.",
		}, []string{"endpoint", "stream", "code"}),
		lateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "infergate_mock_emit_lateness_seconds",
			Help: "Time between each content event's scheduled deadline and its flush: the mock's own cadence error.",
			// Fine-grained at the low end, where a healthy mock lives, so
			// benchmarks can bound how much of the observed latency is ours.
			Buckets: []float64{
				50e-6, 100e-6, 200e-6, 300e-6, 500e-6, 750e-6,
				1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3,
				10e-3, 15e-3, 20e-3, 30e-3, 50e-3, 75e-3, 100e-3,
			},
		}),
		activeStreams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "infergate_mock_active_streams",
			Help: "Streaming responses currently in progress.",
		}),
	}
	m.registry.MustRegister(m.requests, m.lateness, m.activeStreams)
	return m
}
