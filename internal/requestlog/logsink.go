package requestlog

import (
	"context"
	"io"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/stats"
)

// LogSink writes each stamp as one JSON line ("msg":"request"), exactly as
// log/slog's JSON handler would (time, level, msg, then the fields below),
// but encoded directly: slog formats floats through encoding/json, which
// made this line most of the meter's per-request work.
type LogSink struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewLogSink writes stamps to w, one line each.
func NewLogSink(w io.Writer) *LogSink { return &LogSink{w: w} }

// Record implements Sink.
func (l *LogSink) Record(_ context.Context, s *request.Stamp) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := append(l.buf[:0], `{"time":"`...)
	b = time.Now().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request"`...)
	key := func(k string) { b = append(append(append(b, ',', '"'), k...), '"', ':') } // keys need no escaping
	str := func(k, v string) { key(k); b = appendJSONString(b, v) }
	num := func(k string, v int) { key(k); b = strconv.AppendInt(b, int64(v), 10) }
	flt := func(k string, v float64) { key(k); b = appendJSONFloat(b, v) }
	boolean := func(k string, v bool) { key(k); b = strconv.AppendBool(b, v) }
	str("request_id", s.RequestID)
	str("trace_id", s.TraceID)
	str("principal", s.Principal)
	str("tenant", s.Tenant)
	str("model", s.Model)
	str("api", string(s.API))
	str("response_model", s.ResponseModel)
	str("pool", s.Pool)
	str("upstream", s.Upstream)
	if s.Endpoint != "" { // an Endpoint Picker's choice
		str("endpoint", s.Endpoint)
	}
	num("status", s.Status)
	num("attempts", s.Attempts)
	b = append(b, `,"pools_tried":`...)
	if s.PoolsTried == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i, p := range s.PoolsTried {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, p)
		}
		b = append(b, ']')
	}
	boolean("stream", s.Stream)
	num("prompt_tokens", s.PromptTokens)
	num("completion_tokens", s.CompletionTokens)
	str("token_source", s.TokenSource)
	num("cached_tokens", s.CachedTokens)
	if s.CacheWriteTokens > 0 {
		num("cache_write_tokens", s.CacheWriteTokens)
	}
	if c := s.Cost; c.Currency != "" {
		// An exact decimal (a JSON number written from the integer).
		key("cost")
		b = append(b, price.FormatCost(c.Amount)...)
		str("currency", c.Currency)
		str("price_source", c.Price)
		boolean("cost_counted", c.Counted)
	}
	flt("ttft_ms", stats.Ms(s.TTFT))
	flt("itl_p50_ms", stats.Ms(s.ITLP50))
	flt("itl_p95_ms", stats.Ms(s.ITLP95))
	flt("itl_max_ms", stats.Ms(s.ITLMax))
	num("content_events", s.ContentEvents)
	num("unread_events", s.UnreadEvents)
	flt("e2e_ms", stats.Ms(s.E2E))
	flt("total_ms", stats.Ms(s.Total))
	flt("gateway_ms", stats.Ms(s.Gateway.Total))
	flt("gate_ms", stats.Ms(s.Gateway.Gate))
	flt("auth_ms", stats.Ms(s.Gateway.Auth))
	flt("policy_ms", stats.Ms(s.Gateway.Policy))
	flt("ratelimit_ms", stats.Ms(s.Gateway.RateLimit))
	flt("checks_ms", stats.Ms(s.Gateway.Checks))
	if s.Endpoint != "" {
		flt("picker_ms", stats.Ms(s.Gateway.Picker))
	}
	str("decision", s.Decision)
	str("reason", s.Reason)
	if s.Verification != "" {
		str("verification", s.Verification)
	}
	boolean("complete", s.Complete)
	if s.Timing != "" {
		str("timing", string(s.Timing))
	}
	b = append(b, '}', '\n')
	_, _ = l.w.Write(b)
	if cap(b) <= 16<<10 { // keep a normal line's buffer, not a huge one
		l.buf = b
	}
}

// appendJSONString quotes s as slog's JSON handler does: encoding/json's
// escaping, without escaping HTML.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONFloat formats f as encoding/json does (what slog uses).
func appendJSONFloat(b []byte, f float64) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 to e-9, as encoding/json writes it
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
