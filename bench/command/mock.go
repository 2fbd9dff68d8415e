package command

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/infergate/infergate/bench/mock"
	"github.com/infergate/infergate/internal/flagset"
)

// Mock runs `infergate-bench mock`.
func Mock(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flagset.NewFor("infergate-bench", "mock", `Run a mock LLM upstream: OpenAI /v1/chat/completions, /v1/completions,
/v1/responses and /v1/embeddings, Anthropic /v1/messages and
/v1/messages/count_tokens, and /v1/models, /metrics, /mock/control. Output is
deterministic per request; tokens stream on absolute deadlines
t0 + ttft + prompt_tokens*ttft-per-prompt-token + k*itl, in each API's own
stream format. Prompt tokens are the prompt's whitespace-separated words
(token ids one each). An embeddings request answers after
ttft + prompt_tokens*ttft-per-prompt-token.

Capacity model (off by default): at most --max-batch requests run, later ones
queue (beyond --max-queue they get 429); the first token is due ttft +
uncached_prompt_tokens*ttft-per-prompt-token after admission, each next one
itl + (running-1)*itl-per-batch after the previous; --prefix-cache skips
prefill for cached 16-token prompt blocks. /metrics adds vLLM's
vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc,
vllm:prefix_cache_{queries,hits}_total, vllm:cache_config_info and
vllm:lora_requests_info: what the Inference Extension's Endpoint Picker reads.

Per-request overrides: x-mock-ttft-ms, x-mock-itl-ms, x-mock-tokens,
x-mock-tokens-per-event, x-mock-status, x-mock-retry-after-ms,
x-mock-stall-after, x-mock-stall-ms, x-mock-reset-after,
x-mock-malformed-after, x-mock-emit-timestamps (1: precede each SSE event
with a ": t=<unix ns> seq=<n>" comment).

--profile board answers like the public gateway board's mock instead: the
same bytes for every request (non-streaming: a small fixed JSON answer;
streaming: a role chunk, then 64 deltas of 16 bytes, the first at once and
then every 20ms, then finish and [DONE]). There --ttft is the delay before
any response (default 0), --itl the delta interval (default 20ms; 0 for a
zero-delay stream) and --max-tokens the number of deltas (default 64).

--tls-cert and --tls-key serve HTTPS instead, HTTP/2 or HTTP/1.1 as the
client's ALPN asks: a local stand-in for a hosted API behind a gateway that
originates TLS.`, stderr)
	listen := fs.String("listen", "127.0.0.1:8001", "address to listen on")
	profile := fs.String("profile", "", `"board": the public gateway board's fixed responses (see above)`)
	tlsCert := fs.String("tls-cert", "", "serve HTTPS with this PEM certificate chain (with --tls-key)")
	tlsKey := fs.String("tls-key", "", "PEM private key of --tls-cert")
	def := mock.Config{}.WithDefaults()
	cfg := mock.Config{}
	fs.DurationVar(&cfg.TTFT, "ttft", def.TTFT, "time to first content token")
	fs.DurationVar(&cfg.TTFTPerPromptToken, "ttft-per-prompt-token", 0, "extra prefill time per (uncached) prompt token")
	fs.DurationVar(&cfg.ITL, "itl", def.ITL, "gap between content events")
	fs.IntVar(&cfg.TokensPerEvent, "tokens-per-event", def.TokensPerEvent, "tokens per content event")
	fs.DurationVar(&cfg.Jitter, "jitter", 0, "uniform +/- jitter on each deadline (deterministic per request)")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", def.MaxTokens, "output tokens when a request sets no max_tokens")
	fs.BoolVar(&cfg.EmitTimestamps, "emit-timestamps", false, `precede each SSE event with a ": t=<unix ns> seq=<n>" comment`)

	fs.IntVar(&cfg.MaxBatch, "max-batch", 0, "requests running at once; more wait in a FIFO queue (0: no limit)")
	fs.IntVar(&cfg.MaxQueue, "max-queue", 0, "requests waiting at most, beyond which they get 429 (0: no limit, -1: none may wait)")
	fs.DurationVar(&cfg.ITLPerBatch, "itl-per-batch", 0, "ITL added per other running request")
	fs.IntVar(&cfg.KVCacheTokens, "kv-cache-tokens", 0, "KV capacity in tokens behind vllm:kv_cache_usage_perc (0: 65536)")
	fs.IntVar(&cfg.PrefixCacheTokens, "prefix-cache", 0, "prefix cache capacity in tokens, LRU of 16-token blocks (0: off)")

	var faults mock.Faults
	fs.Float64Var(&faults.ErrorRate, "error-rate", 0, "share of requests failed with --error-status, spread evenly (0..1)")
	fs.IntVar(&faults.ErrorStatus, "error-status", 503, "status of injected errors")
	fs.DurationVar(&faults.RetryAfter, "retry-after", 0, "Retry-After of injected errors (429s get 1s when unset)")
	fs.IntVar(&faults.StallAfter, "stall-after", 0, "stall each response for --stall after this many output tokens (0: off)")
	fs.DurationVar(&faults.Stall, "stall", time.Second, "length of the --stall-after stall")
	fs.IntVar(&faults.ResetAfter, "reset-after", 0, "abort the connection after this many output tokens (0: off)")
	fs.IntVar(&faults.MalformedAfter, "malformed-after", 0, "send one event with truncated JSON after this many output tokens (0: off)")
	if err := flagset.Parse(fs, args); err != nil {
		return err
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		fmt.Fprintln(stderr, "mock: --tls-cert and --tls-key go together")
		return flagset.ErrUsage
	}
	switch *profile {
	case "":
	case "board":
		// The board's own defaults, unless a flag says otherwise.
		b := mock.DefaultBoard
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "ttft":
				b.Delay = cfg.TTFT
			case "itl":
				b.Interval = cfg.ITL
			case "max-tokens":
				b.Chunks = cfg.MaxTokens
			}
		})
		cfg.Board = &b
	default:
		fmt.Fprintf(stderr, "mock: unknown --profile %q (want board)\n", *profile)
		return flagset.ErrUsage
	}
	var tlsConfig *tls.Config
	if *tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
		if err != nil {
			return fmt.Errorf("mock: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil))
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	m := mock.New(cfg, logger)
	m.SetFaults(faults)
	srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 5 * time.Second, TLSConfig: tlsConfig}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	serve := func() error { return srv.Serve(lis) }
	if tlsConfig != nil {
		// ServeTLS adds h2 to NextProtos: HTTP/2 when the client offers it.
		serve = func() error { return srv.ServeTLS(lis, "", "") }
	}
	if b := cfg.Board; b != nil {
		logger.Info("mock upstream serving", "addr", lis.Addr().String(), "tls", tlsConfig != nil, "profile", *profile, "delay", b.Delay.String(),
			"chunks", b.Chunks, "interval", b.Interval.String(), "chunk_bytes", b.ChunkBytes)
	} else {
		logger.Info("mock upstream serving", "addr", lis.Addr().String(), "tls", tlsConfig != nil, "ttft", cfg.TTFT.String(), "itl", cfg.ITL.String(),
			"max_batch", cfg.MaxBatch, "prefix_cache_tokens", cfg.PrefixCacheTokens)
	}
	if err := serve(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
