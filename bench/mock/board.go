package mock

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Board is the wire behaviour of the mock behind the public LLM gateway
// overhead board (GetBusbar/benchmarking, described in docs/performance.md),
// so that infergate's overhead is measured the way that board measures
// every gateway. Every response is the same bytes, whatever the request:
//
//   - non-streaming: after Delay, one fixed chat.completion (content "ok",
//     usage 10/2/12);
//   - streaming (the body contains "stream":true): after Delay, the role
//     chunk, then Chunks content deltas of ChunkBytes bytes each (the frame
//     index padded with x, so no two neighbours are alike), the first at
//     once and each next one Interval after the one before, then the finish
//     chunk (finish_reason "stop") and data: [DONE]. No usage chunk.
//
// The deadlines are absolute (first + k·Interval), where the board's mock
// sleeps Interval after each send; the bytes are the same. Per-request
// headers override the cadence: x-mock-ttft-ms (Delay), x-mock-itl-ms
// (Interval), x-mock-tokens (Chunks) and x-mock-emit-timestamps. Nothing
// else of the default mock applies (capacity model, faults, LastRequest).
type Board struct {
	Delay      time.Duration // before any response: the board's MOCK_TTFT_MS (0)
	Chunks     int           // content deltas per stream (64)
	Interval   time.Duration // between deltas after the first (20ms; 0: back to back)
	ChunkBytes int           // text bytes per delta (16)
}

// DefaultBoard is the board's stream mock: 64 deltas of 16 bytes every 20 ms.
var DefaultBoard = Board{Chunks: 64, Interval: 20 * time.Millisecond, ChunkBytes: 16}

const (
	boardHead    = `{"id":"chatcmpl-x","object":"chat.completion.chunk","created":1700000000,"model":"mock","choices":[{"index":0,`
	boardRole    = boardHead + `"delta":{"role":"assistant","content":""},"finish_reason":null}]}`
	boardFinish  = boardHead + `"delta":{},"finish_reason":"stop"}]}`
	boardDone    = `[DONE]`
	boardMessage = `{"id":"chatcmpl-x","object":"chat.completion","created":1700000000,"model":"mock","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":2,"total_tokens":12}}`
)

// boardContent is content delta k's payload, appended to b.
func boardContent(b []byte, k, size int) []byte {
	b = append(b, boardHead...)
	b = append(b, `"delta":{"content":"`...)
	n := len(b)
	b = strconv.AppendInt(b, int64(k), 10)
	for len(b)-n < size {
		b = append(b, 'x')
	}
	return append(b, `"},"finish_reason":null}]}`...)
}

// boardHandler serves the completion endpoints in the board profile.
func (s *Server) boardHandler(kd kind) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, stream := s.serveBoard(w, r)
		s.metrics.requests.WithLabelValues(kd.label(), strconv.FormatBool(stream), strconv.Itoa(code)).Inc()
	})
}

func (s *Server) serveBoard(w http.ResponseWriter, r *http.Request) (code int, stream bool) {
	body, err := readBody(w, r)
	t0 := time.Now()
	s.served.Add(1)
	if err != nil {
		return writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_body", "reading request body: "+err.Error()), false
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed",
			"method "+r.Method+" not allowed on "+r.URL.Path), false
	}
	b := *s.board
	stamp := s.cfg.Load().EmitTimestamps
	for _, o := range []struct {
		name string
		dst  *time.Duration
	}{{"x-mock-ttft-ms", &b.Delay}, {"x-mock-itl-ms", &b.Interval}} {
		v, ok, err := intHeader(r.Header, o.name, 0, maxOverrideMillis)
		if err != nil {
			return writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_header", err.Error()), false
		}
		if ok {
			*o.dst = time.Duration(v) * time.Millisecond
		}
	}
	if v, ok, err := intHeader(r.Header, "x-mock-tokens", 1, maxOutputTokens); err != nil {
		return writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_header", err.Error()), false
	} else if ok {
		b.Chunks = v
	}
	if raw := r.Header.Get("x-mock-emit-timestamps"); raw != "" {
		v, err := strconv.ParseBool(strings.TrimSpace(raw))
		if err != nil {
			return writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_header",
				"invalid x-mock-emit-timestamps header "+strconv.Quote(raw)+": want 1 or 0"), false
		}
		stamp = v
	}
	// Like the board's mock: a substring scan, the body is never parsed.
	stream = bytes.Contains(body, []byte(`"stream":true`)) || bytes.Contains(body, []byte(`"stream": true`))

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	if err := sleepUntil(r.Context(), timer, t0.Add(b.Delay)); err != nil {
		return statusClientClosed, stream
	}
	if !stream {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(boardMessage)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(boardMessage))
		return http.StatusOK, false
	}
	s.boardStream(r.Context(), w, b, stamp, timer)
	return http.StatusOK, true
}

func (s *Server) boardStream(ctx context.Context, w http.ResponseWriter, b Board, stamp bool, timer *time.Timer) {
	s.metrics.activeStreams.Inc()
	defer s.metrics.activeStreams.Dec()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sw := newSSEWriter(w, stamp)
	if sw.event([]byte(boardRole)) != nil {
		return
	}
	first := time.Now()
	payload := make([]byte, 0, len(boardHead)+64+b.ChunkBytes)
	for k := range b.Chunks {
		deadline := first.Add(time.Duration(k) * b.Interval)
		if sleepUntil(ctx, timer, deadline) != nil {
			return
		}
		if sw.event(boardContent(payload[:0], k, b.ChunkBytes)) != nil {
			return
		}
		if k > 0 {
			s.metrics.lateness.Observe(time.Since(deadline).Seconds())
		}
	}
	if sw.event([]byte(boardFinish)) == nil {
		_ = sw.event([]byte(boardDone))
	}
}
