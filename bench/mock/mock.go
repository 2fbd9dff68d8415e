// Package mock implements a mock LLM upstream that emits tokens on a fixed,
// drift-free cadence and, when asked, behaves like a GPU inference pool: a
// bounded batch, a waiting queue and a prefix cache.
//
// Response bytes are a pure function of the request's semantic content
// (model, prompt, output length and, for embeddings, dimensions and
// encoding), so end-to-end tests can compare bodies byte for byte across
// gateway paths. Events are scheduled on absolute deadlines, and the mock
// exports its own achieved-cadence error, so benchmarks can separate mock
// lateness from gateway overhead. On Linux a
// kernel high-resolution timer keeps the deadlines (bench/internal/pacer):
// tens of microseconds late at the median rather than the half millisecond
// of the Go runtime's timers in an idle process. Everything
// below is off by default and changes timing or faults, never the content.
//
// # APIs
//
// Every API gets the same cadence, capacity model, faults, x-mock-* headers
// and /mock/control, each in its own wire format and error format:
//
//   - OpenAI POST /v1/chat/completions and /v1/completions;
//   - OpenAI POST /v1/responses (see responses.go for the event sequence);
//   - Anthropic POST /v1/messages (see messages.go) and
//     /v1/messages/count_tokens, which answers {"input_tokens": N} at once
//     and bills nothing;
//   - OpenAI POST /v1/embeddings (see embeddings.go): a prefill alone,
//     answered TTFT + TTFTPerPromptToken·uncached after admission;
//   - GET /v1/models.
//
// Prompt tokens are counted the same way for every API: the
// whitespace-separated words of the prompt's text, token ids one each, at
// least 1. The text is that of the chat messages (string contents and text
// parts), the completions prompt, the Responses instructions and input
// items (string contents and input_text/output_text parts), the Anthropic
// system prompt and messages (text blocks), or the embeddings inputs; other
// parts (images, tools) count nothing. count_tokens reports what the same
// body sent to /v1/messages would bill.
//
// # Capacity model
//
// Prompt tokens are the prompt's whitespace-separated words (or token ids).
// At most MaxBatch requests run at once (0: no limit); later ones wait in a
// FIFO queue, and beyond MaxQueue waiting ones are refused with 429 and a
// Retry-After. For a request admitted into the batch at time a:
//
//	first token  = a + TTFT + TTFTPerPromptToken·uncached
//	next token   = previous deadline + ITL(b),  ITL(b) = ITL + ITLPerBatch·(b−1)
//
// where uncached is the prompt minus its leading blocks found in the prefix
// cache (at least 1), and b is the number of requests running when the
// previous token left, so ITL follows the batch as it changes. The prefix
// cache (PrefixCacheTokens > 0) is an LRU of 16-token blocks, each keyed by a
// hash of the whole prompt up to it; a request's blocks are cached when it
// is admitted. With N output tokens a request holds its slot for
// S(b) = TTFT + prefill + (N−1)·ITL(b). So in a closed-loop sweep at
// concurrency C with B = MaxBatch: up to C = B nothing waits, TTFT is flat and
// ITL grows by ITLPerBatch per request; beyond B, C−B requests queue,
// throughput stays at B·N/S(B) tokens/s and latency grows as C/B·S(B). The
// knee of a TTFT SLO is therefore at C ≈ B; an ITL SLO breaks earlier if
// ITL(C) crosses it first, at C ≈ 1 + (SLO−ITL)/ITLPerBatch.
//
// /metrics reports the model's measured state under vLLM's names:
// vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc (tokens held by running requests, prompt plus
// output so far, over KVCacheTokens; reported, not enforced), and
// vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total in tokens,
// and vLLM's info metrics vllm:cache_config_info (block_size 16,
// num_gpu_blocks from KVCacheTokens) and vllm:lora_requests_info (no
// adapters): every metric the Gateway API Inference Extension's Endpoint
// Picker (v1.4.0) scrapes by default.
//
// # Faults
//
// Faults (server-wide, also settable through /mock/control) and x-mock-*
// request headers inject an evenly spread error rate (429s carry
// Retry-After), a stall after output token k, a connection abort after token
// k (the client sees a truncated body, never a clean end), and one event with
// truncated JSON after token k.
//
// # Ledger
//
// A request naming an account in x-mock-ledger is booked in it: the prompt
// tokens it was admitted with and the output tokens decoded until it ended
// or its client hung up (see ledger.go), served at GET /mock/ledger. Two
// request shapes exist for it: background: true on /v1/responses answers
// queued at once and generates on, and prompt_logprobs on chat and text
// completions writes vLLM's prompt_logprobs after usage. The header
// x-mock-output-cap: largest makes the largest output cap the body names
// the output length, as a server reading another key than the gateway did.
// n on chat and text completions writes every token once per choice
// (streamed, one event per choice) and counts them all in usage.
//
// # Emit timestamps
//
// With EmitTimestamps, or the request header x-mock-emit-timestamps: 1, every
// SSE event is preceded, in the same write, by a comment line:
//
//	: t=1767225600123456789 seq=0
//	data: {"id":"chatcmpl-…",…}
//
// t is the mock's wall clock, in Unix nanoseconds, just before the event was
// written; seq numbers the stream's events from 0 (role, content, finish,
// usage and [DONE] alike). SSE clients, the OpenAI SDKs included, ignore
// comment lines, and dropping them gives back the unstamped stream exactly.
// A client on the same clock gets each event's transit time, and events that
// arrive together despite distinct stamps reveal coalescing on the way.
//
// # Lock-step streams
//
// A request with the header x-mock-lockstep: <id> streams in lock step with
// its client: event n+1 (every SSE event, the first included) is written
// only once the client has said, out of band, that it received event n:
// in-process with Server.Lockstep(id).Ack(n), or with
// POST /mock/lockstep/<id>/ack?n=N. The bytes and deadlines are those of
// the same request without the header; an event leaves at its deadline or
// on the previous one's acknowledgement, whichever is later. A gateway that
// holds events back (buffers the response) then deadlocks the stream at
// once, on any machine: the client waits for event n, the mock for its
// acknowledgement. Streaming is proven by causality, with no timing in the
// proof. Lockstep.Emitted gives each event's emit time (see lockstep.go).
// With x-mock-lockstep-unseen: usage, the usage-only event of a chat or
// completions stream (stream_options.include_usage) is acknowledged by the
// mock itself: a gateway that asked for it on behalf of a client that did
// not removes it, so that client never sees it; [DONE] then follows it.
package mock

import (
	"bytes"
	"context"
	"crypto/tls"
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

	"github.com/infergate/infergate/bench/internal/pacer"
	"github.com/infergate/infergate/internal/openai"
)

// Defaults applied by Config.WithDefaults.
const (
	defaultTTFT           = 50 * time.Millisecond
	defaultITL            = 20 * time.Millisecond
	defaultTokensPerEvent = 1
	defaultMaxTokens      = 64
	defaultKVCacheTokens  = 1 << 16
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
	MaxTokens          int           // output tokens when the request sets no max_tokens / max_completion_tokens / max_output_tokens (default 64)
	EmitTimestamps     bool          // precede each SSE event with a ": t=<unix ns> seq=<n>" comment

	// Capacity model (see the package doc); the zero values turn it off.
	// TTFTPerPromptToken is its prefill cost per uncached prompt token.
	MaxBatch          int           // requests running at once; more wait in a FIFO queue (0: no limit)
	MaxQueue          int           // requests waiting at most, beyond which they get 429 (0: no limit; negative: none may wait)
	ITLPerBatch       time.Duration // ITL added per other running request
	KVCacheTokens     int           // KV capacity behind vllm:kv_cache_usage_perc (default 65536 when normalized)
	PrefixCacheTokens int           // prefix cache capacity in tokens, in 16-token blocks (0: off)

	// Board, if set, switches the completion endpoints to the public
	// gateway board's fixed responses (see Board); only EmitTimestamps of
	// the fields above still applies. Fixed when the Server is created.
	Board *Board
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
// Jitter, TTFTPerPromptToken and the capacity model default to zero (off)
// and are left alone.
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
	c.MaxBatch = max(c.MaxBatch, 0)
	c.MaxQueue = max(c.MaxQueue, -1)
	c.ITLPerBatch = max(c.ITLPerBatch, 0)
	if c.KVCacheTokens <= 0 {
		c.KVCacheTokens = defaultKVCacheTokens
	}
	c.PrefixCacheTokens = max(c.PrefixCacheTokens, 0)
	return c
}

// Server is the mock upstream. Create it with New; it is safe for concurrent
// use.
type Server struct {
	cfg     atomic.Pointer[Config] // swapped at runtime through /mock/control
	faults  atomic.Pointer[Faults]
	faultN  atomic.Int64 // completion requests seen by the fault injector
	engine  engine
	logger  *slog.Logger
	metrics *metrics
	handler http.Handler
	served  atomic.Int64
	usage   struct{ prompt, completion atomic.Int64 }
	board   *Board // nil: the default mock
	ledger  ledger

	lockstep lockstepGates // x-mock-lockstep's gates, by id

	models atomic.Pointer[[]string] // GET /v1/models; nil: mock-model

	mu         sync.Mutex
	lastHeader http.Header
	lastBody   []byte
	lastInfo   RequestInfo
}

// New returns a Server using cfg (after WithDefaults). A nil logger discards
// logs.
func New(cfg Config, logger *slog.Logger) *Server {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{logger: logger}
	if cfg.Board != nil {
		b := *cfg.Board
		b.Delay, b.Interval = max(b.Delay, 0), max(b.Interval, 0)
		b.Chunks, b.ChunkBytes = max(b.Chunks, 0), max(b.ChunkBytes, 0)
		s.board = &b
	}
	s.metrics = newMetrics(s)
	s.SetConfig(cfg)
	s.faults.Store(&Faults{})
	s.handler = s.routes()
	return s
}

// Handler returns the HTTP handler serving every route of the mock.
func (s *Server) Handler() http.Handler { return s.handler }

// Served reports how many requests to the inference APIs (chat and legacy
// completions, responses, messages and their count_tokens, embeddings) the
// server has received, whatever their outcome, including 4xx.
func (s *Server) Served() int64 { return s.served.Load() }

// LastRequest returns copies of the headers and body of the most recent
// request to an inference API. Only those endpoints are recorded, so that
// health checks and metric scrapes arriving through a gateway cannot
// overwrite the request a test wants to inspect. Both are nil before the first request.
func (s *Server) LastRequest() (http.Header, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastHeader.Clone(), bytes.Clone(s.lastBody)
}

// Usage is what the server did, as a GPU pool would bill it: the prompt
// tokens of every request it started generating for, and the completion
// tokens that left it (an event counts once flushed; a non-streamed answer
// once written). A client that leaves mid-stream is billed what was sent.
type Usage struct {
	PromptTokens     int64
	CompletionTokens int64
}

// Usage returns the tokens billed so far (the ledger a gateway's charges
// are checked against).
func (s *Server) Usage() Usage {
	return Usage{PromptTokens: s.usage.prompt.Load(), CompletionTokens: s.usage.completion.Load()}
}

// RequestInfo is how a request arrived, beyond its headers and body.
type RequestInfo struct {
	Host  string               // Host (HTTP/1.1) or :authority (HTTP/2)
	Proto string               // "HTTP/1.1" or "HTTP/2.0"
	TLS   *tls.ConnectionState // nil in plain text; the SNI is ServerName, the ALPN protocol NegotiatedProtocol
}

// LastRequestInfo returns how the request LastRequest shows arrived (the
// zero value before the first one), so that a test can check what a
// gateway's TLS origination and host rewriting sent.
func (s *Server) LastRequestInfo() RequestInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := s.lastInfo
	if info.TLS != nil {
		cs := *info.TLS
		info.TLS = &cs
	}
	return info
}

func (s *Server) recordRequest(r *http.Request, body []byte) {
	h := r.Header.Clone()
	s.mu.Lock()
	s.lastHeader, s.lastBody = h, body
	s.lastInfo = RequestInfo{Host: r.Host, Proto: r.Proto, TLS: r.TLS}
	s.mu.Unlock()
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	// Method checks happen in the handlers rather than in mux patterns so
	// that a wrong method gets an OpenAI-style JSON error, not the mux's
	// plain-text 405.
	if s.board != nil {
		mux.Handle("/v1/chat/completions", s.boardHandler(kindChat))
		mux.Handle("/v1/completions", s.boardHandler(kindText))
	} else {
		mux.Handle("/v1/chat/completions", s.completionHandler(kindChat))
		mux.Handle("/v1/completions", s.completionHandler(kindText))
	}
	// The other APIs have no board profile: the default mock serves them.
	mux.Handle("/v1/responses", s.completionHandler(kindResponses))
	mux.Handle("/v1/messages", s.completionHandler(kindMessages))
	mux.Handle("/v1/messages/count_tokens", s.completionHandler(kindCountTokens))
	mux.Handle("/v1/embeddings", s.completionHandler(kindEmbeddings))
	mux.Handle("/v1/models", onlyGet(http.HandlerFunc(s.handleModels)))
	mux.Handle("/healthz", onlyGet(http.HandlerFunc(handleHealth)))
	mux.Handle("/metrics", onlyGet(promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{})))
	mux.HandleFunc("/mock/control", s.handleControl)
	mux.Handle("/mock/ledger", onlyGet(http.HandlerFunc(s.handleLedger)))
	mux.HandleFunc("POST /mock/lockstep/{id}/ack", s.handleLockstepAck)
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

// SetModels sets the ids GET /v1/models lists (mock-model until set).
func (s *Server) SetModels(ids ...string) { s.models.Store(&ids) }

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	ids := []string{"mock-model"}
	if set := s.models.Load(); set != nil {
		ids = *set
	}
	list := openai.ModelList{Object: "list", Data: []openai.Model{}}
	for _, id := range ids {
		list.Data = append(list.Data, openai.Model{ID: id, Object: "model", Created: 0, OwnedBy: "infergate-mock"})
	}
	writeJSON(w, http.StatusOK, list)
}

func (s *Server) completionHandler(k kind) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, stream, err := s.serveCompletion(w, r, k)
		s.metrics.requests.WithLabelValues(k.label(), strconv.FormatBool(stream), strconv.Itoa(code)).Inc()
		if errors.Is(err, errAbort) {
			// The server then drops the connection without ending the
			// body (no last chunk on HTTP/1.1, RST_STREAM on HTTP/2).
			panic(http.ErrAbortHandler)
		}
	})
}

// errAbort asks the handler to abort the connection (the reset fault).
var errAbort = errors.New("mock: injected connection reset")

// Statuses recorded, never sent, following the nginx conventions: a
// non-streaming client left before its response was due, or the reset fault
// dropped a non-streaming request without a response.
const (
	statusClientClosed = 499
	statusNoResponse   = 444
)

// serveCompletion handles one request to an inference API and reports the
// status it produced and whether the request asked to stream, for the
// request counter, and errAbort when the connection must be cut.
func (s *Server) serveCompletion(w http.ResponseWriter, r *http.Request, k kind) (code int, stream bool, err error) {
	body, readErr := readBody(w, r)
	// t0 is taken after the body is read so that the configured TTFT is
	// measured from the moment the mock could start work, independent of how
	// fast the gateway forwarded the body.
	t0 := time.Now()
	s.recordRequest(r, body)
	s.served.Add(1)
	// fail answers with an error in the API's own format.
	fail := func(status int, typ, code, message string) int {
		if k.anthropic() {
			return writeAnthropicError(w, status, message)
		}
		return writeError(w, status, typ, code, message)
	}

	if readErr != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(readErr, &tooLarge) {
			return fail(http.StatusRequestEntityTooLarge, typeInvalidRequest, "request_too_large", readErr.Error()), false, nil
		}
		return fail(http.StatusBadRequest, typeInvalidRequest, "invalid_body", "reading request body: "+readErr.Error()), false, nil
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return fail(http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed",
			"method "+r.Method+" not allowed on "+r.URL.Path), false, nil
	}
	p, err := s.parseParams(r.Header)
	if err != nil {
		return fail(http.StatusBadRequest, typeInvalidRequest, "invalid_header", err.Error()), false, nil
	}
	req, apiErr := parseRequest(k, body)
	if apiErr != nil {
		return fail(http.StatusBadRequest, typeInvalidRequest, apiErr.code, apiErr.message), req.Stream, nil
	}
	if p.status == 0 {
		p.status = s.injectFault()
	}
	if p.status != 0 {
		typ, code := injectedErrorKind(p.status)
		setRetryAfter(w.Header(), p.status, p.retryAfter)
		return fail(p.status, typ, code, "mock: injected status "+strconv.Itoa(p.status)), req.Stream, nil
	}
	c, apiErr := newCompletion(k, req, p, *s.cfg.Load(), t0)
	if apiErr != nil {
		return fail(http.StatusBadRequest, typeInvalidRequest, apiErr.code, apiErr.message), req.Stream, nil
	}
	if k == kindCountTokens {
		// Counting is no inference: no batch slot, no delay, nothing billed.
		return writeJSON(w, http.StatusOK, countTokensResponse{InputTokens: c.promptTokens}), false, nil
	}
	defer s.ledger.open(r.Header).book(c)
	t, err := s.engine.admit(t0)
	if err != nil {
		setRetryAfter(w.Header(), http.StatusTooManyRequests, p.retryAfter)
		return fail(http.StatusTooManyRequests, typeRateLimit, "queue_full",
			"mock: the waiting queue is full, retry later"), req.Stream, nil
	}
	defer t.release()
	switch {
	case k == kindEmbeddings:
		return s.embed(r.Context(), w, c, t), false, nil
	case c.background:
		return s.background(w, c, t), false, nil
	case req.Stream:
		return http.StatusOK, true, s.stream(r.Context(), w, c, t)
	}
	code, err = s.complete(r.Context(), w, c, t)
	return code, false, err
}

// setRetryAfter sets Retry-After on an error response: always on a 429
// (1s unless configured), on other statuses only when configured.
func setRetryAfter(h http.Header, status int, d time.Duration) {
	if d <= 0 {
		if status != http.StatusTooManyRequests {
			return
		}
		d = time.Second
	}
	h.Set("Retry-After", strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10))
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

// stream writes c as server-sent events on its absolute schedule. It
// returns errAbort when the reset fault fires; a departed client is logged,
// not returned.
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, c *completion, t *ticket) error {
	s.metrics.activeStreams.Inc()
	defer s.metrics.activeStreams.Dec()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sw := newSSEWriter(w, c.emitTimestamps)
	sw.ctx, sw.lockstep = ctx, c.lockstep

	// Everything before the first token goes at t0, even for a request
	// waiting for a batch slot, like a server that accepted it.
	if err := c.streamOpen(sw); err != nil {
		s.clientGone(c, 0, err)
		return nil
	}

	words := c.words()
	events, err := s.play(ctx, c, t, func(n int) error {
		return c.streamContent(sw, words.next(n))
	}, func() error {
		return c.streamMalformed(sw)
	})
	if err != nil {
		if errors.Is(err, errAbort) {
			return err
		}
		s.clientGone(c, events, err)
		return nil
	}
	if err := c.streamClose(sw); err != nil {
		s.clientGone(c, events, err)
	}
	return nil
}

// complete writes c as a single JSON body once its last token would have
// been emitted, so non-streaming latency matches the streaming total.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, c *completion, t *ticket) (int, error) {
	malformed := false
	if _, err := s.play(ctx, c, t, nil, func() error { malformed = true; return nil }); err != nil {
		if errors.Is(err, errAbort) {
			return statusNoResponse, err
		}
		s.clientGone(c, 0, err)
		return statusClientClosed, nil
	}
	if malformed {
		s.usage.completion.Add(int64(c.outputTokens * c.choices))
		b, _ := json.Marshal(c.fullResponse())
		b = b[:len(b)/2]
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
		return http.StatusOK, nil
	}
	s.usage.completion.Add(int64(c.outputTokens * c.choices))
	return writeJSON(w, http.StatusOK, c.fullResponse()), nil
}

// play waits for c's admission, then walks its content events on their
// deadlines, calling emit with each event's token count, and applies c's
// mid-stream faults; malformed sends the broken event. A nil emit (the
// non-streaming path) only keeps time, sleeping through intermediate events
// only when the batch or a fault can move them. It returns the number of
// content events sent.
func (s *Server) play(ctx context.Context, c *completion, t *ticket, emit func(n int) error, malformed func() error) (int, error) {
	if err := s.prefill(ctx, c, t); err != nil {
		return 0, err
	}
	timer := time.NewTimer(math.MaxInt64)
	defer timer.Stop()
	f := c.faults
	events := c.events()
	base := c.sched.first // the un-jittered deadline of event k
	sent, held := 0, 0
	skipFrom, skipBase := -1, time.Time{} // the first event skipped since the last wait, and its deadline
	for k := range events {
		if k > 0 {
			base = base.Add(c.itl(s.engine.running.Load()))
		}
		n := min(c.tokensPerEvent, c.outputTokens-sent)
		sent += n
		// at reports whether token position p falls in this event.
		at := func(p int) bool { return p > sent-n && p <= sent }
		faulty := at(f.stallAfter) && f.stall > 0 || at(f.resetAfter) || at(f.malformedAfter)
		if emit == nil && c.itlPerBatch == 0 && !faulty && k < events-1 {
			if skipFrom < 0 {
				skipFrom, skipBase = k, base
			}
			continue
		}
		deadline := c.sched.jittered(k, base)
		if err := sleepUntil(ctx, timer, deadline); err != nil {
			if skipFrom >= 0 { // the skipped events due by now were decoded
				c.decoded = c.decodedBy(time.Now(), skipFrom, skipBase)
			}
			return k, err
		}
		skipFrom = -1
		c.decoded = sent // due, hence decoded, whether or not it reaches anyone
		if emit != nil {
			if err := emit(n); err != nil {
				return k, err
			}
			s.usage.completion.Add(int64(n * c.choices))
			// Measured after the flush: that is when the bytes left the
			// mock, which is what a downstream meter can observe.
			s.metrics.lateness.Observe(time.Since(deadline).Seconds())
		}
		t.hold(sent - held)
		held = sent
		if at(f.malformedAfter) {
			if err := malformed(); err != nil {
				return k + 1, err
			}
		}
		if at(f.stallAfter) && f.stall > 0 {
			base = base.Add(f.stall)
			if err := sleepUntil(ctx, timer, deadline.Add(f.stall)); err != nil {
				return k + 1, err
			}
		}
		if at(f.resetAfter) {
			return k + 1, errAbort
		}
	}
	return events, nil
}

// prefill waits for c's admission, looks its prompt up in the prefix cache,
// anchors its schedule and bills its prompt tokens.
func (s *Server) prefill(ctx context.Context, c *completion, t *ticket) error {
	if err := t.wait(ctx); err != nil {
		return err
	}
	cached := 0
	if hits, ok := s.engine.matchPrefix(c.blocks); ok {
		// Like vLLM, at least the last prompt token is always computed.
		cached = min(hits*blockTokens, c.promptTokens-1)
		s.metrics.prefixQueries.Add(float64(c.promptTokens))
		s.metrics.prefixHits.Add(float64(cached))
	}
	c.start(t.admitted, cached)
	c.prompted = c.promptTokens
	t.hold(c.promptTokens)
	s.usage.prompt.Add(int64(c.promptTokens))
	return nil
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
	pacer.Expect(deadline) // wakes an idle runtime on time
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
	w     http.ResponseWriter
	rc    *http.ResponseController
	buf   []byte
	stamp bool // precede events with an emit-time comment
	seq   int  // events written so far (the Responses API's sequence_number)

	// A lock-step stream's gate (see lockstep.go): each event waits for the
	// previous one's acknowledgement, or for ctx to end.
	lockstep *Lockstep
	ctx      context.Context
}

func newSSEWriter(w http.ResponseWriter, stamp bool) *sseWriter {
	return &sseWriter{w: w, rc: http.NewResponseController(w), stamp: stamp}
}

// send writes v as one "data: <json>\n\n" event.
func (s *sseWriter) send(v any) error { return s.sendNamed("", v) }

// sendNamed writes v as one event with an "event: <name>" line (none when
// name is empty), as the Responses and Anthropic streams have.
func (s *sseWriter) sendNamed(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.named(name, b)
}

// event writes one "data: <payload>\n\n" event.
func (s *sseWriter) event(payload []byte) error { return s.named("", payload) }

// named writes one event, preceded by its ": t=<unix ns> seq=<n>" comment
// when stamping.
func (s *sseWriter) named(name string, payload []byte) error {
	if s.lockstep != nil {
		if err := s.lockstep.await(s.ctx, s.seq); err != nil {
			return err
		}
	}
	s.buf = s.buf[:0]
	if s.stamp {
		s.buf = append(s.buf, ": t="...)
		s.buf = strconv.AppendInt(s.buf, time.Now().UnixNano(), 10)
		s.buf = append(s.buf, " seq="...)
		s.buf = strconv.AppendInt(s.buf, int64(s.seq), 10)
		s.buf = append(s.buf, '\n')
	}
	s.seq++
	if name != "" {
		s.buf = append(s.buf, "event: "...)
		s.buf = append(s.buf, name...)
		s.buf = append(s.buf, '\n')
	}
	s.buf = append(s.buf, "data: "...)
	s.buf = append(s.buf, payload...)
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
	prefixQueries prometheus.Counter
	prefixHits    prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "infergate_mock_requests_total",
			Help: "Requests to the inference APIs received by the mock upstream.",
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
		// vLLM's names, so that gateways and autoscalers that read vLLM
		// (e.g. the Gateway API inference extension) can run against the mock.
		prefixQueries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:prefix_cache_queries_total",
			Help: "Prefix cache queries, in terms of number of queried tokens.",
		}),
		prefixHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:prefix_cache_hits_total",
			Help: "Prefix cache hits, in terms of number of cached tokens.",
		}),
	}
	e := &s.engine
	m.registry.MustRegister(m.requests, m.lateness, m.activeStreams, m.prefixQueries, m.prefixHits, vllmInfo{s: s, since: time.Now()},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vllm:num_requests_running",
			Help: "Number of requests in model execution batches.",
		}, func() float64 { return float64(e.running.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vllm:num_requests_waiting",
			Help: "Number of requests waiting to be processed.",
		}, func() float64 { return float64(e.queued.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vllm:kv_cache_usage_perc",
			Help: "KV-cache usage. 1 means 100 percent usage.",
		}, func() float64 {
			return min(float64(e.kvTokens.Load())/float64(s.cfg.Load().KVCacheTokens), 1)
		}),
	)
	return m
}

// vllmInfo is vLLM's two info metrics, whose labels carry the values: the
// KV cache's geometry (vllm:cache_config_info, blocks of the prefix cache's
// 16 tokens over KVCacheTokens) and the LoRA adapters loaded (none; the
// value of vllm:lora_requests_info is when that last changed, in Unix
// seconds, as vLLM reports it). The Inference Extension's Endpoint Picker
// reads both on every scrape and logs an error when either is missing.
type vllmInfo struct {
	s     *Server
	since time.Time
}

var (
	cacheConfigInfo = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
		[]string{"block_size", "num_gpu_blocks"}, nil)
	loraRequestsInfo = prometheus.NewDesc("vllm:lora_requests_info", "Running stats on LoRA requests.",
		[]string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil)
)

func (v vllmInfo) Describe(ch chan<- *prometheus.Desc) { ch <- cacheConfigInfo; ch <- loraRequestsInfo }

func (v vllmInfo) Collect(ch chan<- prometheus.Metric) {
	blocks := v.s.cfg.Load().KVCacheTokens / blockTokens
	ch <- prometheus.MustNewConstMetric(cacheConfigInfo, prometheus.GaugeValue, 1, strconv.Itoa(blockTokens), strconv.Itoa(blocks))
	ch <- prometheus.MustNewConstMetric(loraRequestsInfo, prometheus.GaugeValue, float64(v.since.Unix()), "0", "", "")
}
