package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// ChatPath is the chat API's path (see API.Path for the others).
const ChatPath = "/v1/chat/completions"

// maxErrorBody bounds how much of a non-2xx body is read for its message.
const maxErrorBody = 64 << 10

// maxBody bounds a non-streaming response.
const maxBody = 64 << 20

// Error classes (result.Errors.ByClass keys).
const (
	ClassHTTP4xx    = "http_4xx"
	ClassHTTP429    = "http_429"
	ClassHTTP5xx    = "http_5xx"
	ClassTimeout    = "timeout"
	ClassConnection = "connection" // no response: refused, reset, DNS, TLS
	ClassStream     = "stream"     // malformed, truncated or error-carrying stream
	ClassOther      = "other"
)

// TokenSource says how a request's output tokens were counted.
type TokenSource uint8

// Token sources, best first.
const (
	TokensUsage  TokenSource = iota + 1 // the usage object the server sent
	TokensEvents                        // content events counted (no usage chunk)
	TokensWords                         // non-streaming without usage: words of the content
)

func (t TokenSource) String() string {
	switch t {
	case TokensUsage:
		return "usage"
	case TokensEvents:
		return "events"
	case TokensWords:
		return "words"
	}
	return ""
}

// Sample is one request to one target as the client saw it. Intended is
// when the request should have been sent (the open-loop schedule's time,
// or the moment a closed-loop user became free); Start is when it was.
// TTFT and E2E are measured from Start.
type Sample struct {
	Target       int // index in Config.Targets
	Item         int // workload item; every target got the same item
	Phase        Phase
	Intended     time.Time
	Start        time.Time
	Queue        time.Duration // intended → free concurrency slot (open loop with a cap)
	TTFT         time.Duration // to the first event carrying content (= E2E without streaming; 0 for embeddings)
	E2E          time.Duration // to data: [DONE] or the end of the body
	Gaps         int           // gaps between content events
	GapSum       time.Duration
	MaxGap       time.Duration // the longest stall
	InputTokens  int           // usage.prompt_tokens, else the words sent
	OutputTokens int
	TokenSource  TokenSource
	Streamed     bool
	Status       int    // HTTP status; 0 if no response arrived
	Class        string // error class; empty on success
	Err          string // empty on success
	Bytes        int    // response body bytes read
	Model        string
	Tenant       string
	// RequestID is the x-request-id the target answered with (Envoy sets it
	// with always_set_request_id_in_response); TraceID the trace this
	// request started when Config.Trace is set. Join pairs samples with the
	// gateway's records by them.
	RequestID string
	TraceID   string
}

// OK reports whether the request succeeded.
func (s *Sample) OK() bool { return s.Err == "" }

// Lag is the time from the intended to the actual send.
func (s *Sample) Lag() time.Duration { return max(s.Start.Sub(s.Intended), 0) }

// TPOT is the request's mean time per output token after the first,
// (E2E − TTFT)/(tokens − 1); ok is false when it is undefined.
func (s *Sample) TPOT() (time.Duration, bool) {
	if !s.Streamed || s.OutputTokens < 2 {
		return 0, false
	}
	return (s.E2E - s.TTFT) / time.Duration(s.OutputTokens-1), true
}

// MeanGap is the mean of the request's gaps; ok is false without gaps.
func (s *Sample) MeanGap() (time.Duration, bool) {
	if s.Gaps == 0 {
		return 0, false
	}
	return s.GapSum / time.Duration(s.Gaps), true
}

func (s *Sample) fail(class, msg string) {
	if s.Err == "" {
		s.Class, s.Err = class, msg
	}
}

// newClient returns a keep-alive HTTP/1.1 client able to hold conns idle
// connections to each of targets, so steady state opens no connections.
// Proxies and compression are off: the tool measures the target, directly.
// dial, if not nil, replaces the TCP dialer.
func newClient(conns, targets int, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	return &http.Client{Transport: &http.Transport{
		DialContext:           dial,
		MaxIdleConns:          conns * targets,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}}
}

// do sends req to url, with the target's extra headers, and reads the
// response to its end into s (whose Start is set here, just before the
// send).
func do(ctx context.Context, client *http.Client, url string, extra map[string]string, req *Request, timeout time.Duration, trace bool, sr *streamReader, s *Sample) {
	s.Streamed, s.Model, s.Tenant, s.InputTokens = req.Stream, req.Model, req.Tenant, req.InputTokens
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(req.Body))
	if err != nil {
		s.Start = time.Now()
		s.fail(ClassOther, err.Error())
		return
	}
	hr.Header = req.Header.Clone()
	for k, v := range extra {
		hr.Header.Set(k, v)
	}
	if req.Host != "" {
		hr.Host = req.Host
	}
	if trace {
		s.TraceID = newTraceID()
		hr.Header.Set("traceparent", "00-"+s.TraceID+"-"+newSpanID()+"-01")
	}

	s.Start = time.Now()
	resp, err := client.Do(hr)
	if err != nil {
		s.E2E = time.Since(s.Start)
		s.fail(transportClass(err, ClassConnection), describe(err, timeout))
		return
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode
	s.RequestID = resp.Header.Get("x-request-id")
	cr := &countingReader{r: resp.Body}
	defer func() { s.Bytes = cr.n }()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(cr, maxErrorBody))
		s.E2E = time.Since(s.Start)
		s.fail(statusClass(resp.StatusCode), httpError(resp.StatusCode, b))
		return
	}
	if !req.Stream {
		readWhole(s, req.API.orDefault(), cr, timeout, sr.raw)
		return
	}
	if err := sr.read(s, req.API, cr); err != nil {
		s.fail(transportClass(err, ClassStream), "reading stream: "+describe(err, timeout))
	}
}

// readWhole reads a non-streaming response: TTFT is E2E, there are no
// gaps. Embeddings have no tokens out: their TTFT stays zero (none).
func readWhole(s *Sample, api API, r io.Reader, timeout time.Duration, raw *Raw) {
	b, err := io.ReadAll(io.LimitReader(r, maxBody))
	s.E2E = time.Since(s.Start)
	if api != APIEmbeddings {
		s.TTFT = s.E2E
	}
	if raw != nil {
		raw.Body = append(raw.Body, b...)
	}
	if err != nil {
		s.fail(transportClass(err, ClassStream), "reading body: "+describe(err, timeout))
		return
	}
	if !gjson.ValidBytes(b) {
		s.fail(ClassStream, "malformed response: "+truncate(string(b), 200))
		return
	}
	if msg := gjson.GetBytes(b, "error.message"); msg.Exists() {
		s.fail(ClassStream, "error in response: "+truncate(msg.String(), 200))
		return
	}
	content, u := api.whole(b)
	if u.IsObject() {
		in, out := usageTokens(u)
		s.OutputTokens, s.TokenSource = out, TokensUsage
		if in > 0 {
			s.InputTokens = in
		}
	} else {
		s.OutputTokens, s.TokenSource = len(strings.Fields(content)), TokensWords
	}
	if api == APIEmbeddings {
		s.OutputTokens = 0 // vectors, not tokens
	}
	if content == "" && s.OutputTokens == 0 {
		s.fail(ClassStream, "response carried no content")
	}
}

func statusClass(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return ClassHTTP429
	case status >= 500:
		return ClassHTTP5xx
	case status >= 400:
		return ClassHTTP4xx
	}
	return ClassOther // 1xx/3xx that the client did not follow
}

// transportClass classifies an error from the transport: deadlines are
// timeouts, anything else is fallback (connection before a response,
// stream after one).
func transportClass(err error, fallback string) string {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return ClassTimeout
	}
	return fallback
}

// httpError describes a non-2xx response, using an OpenAI-style
// {"error":{"message":...}} body when there is one.
func httpError(status int, body []byte) string {
	msg := strings.TrimSpace(string(body))
	if m := gjson.GetBytes(body, "error.message"); gjson.ValidBytes(body) && m.String() != "" {
		msg = m.String()
	}
	if msg == "" {
		return fmt.Sprintf("HTTP %d", status)
	}
	return fmt.Sprintf("HTTP %d: %s", status, truncate(msg, 200))
}

func describe(err error, timeout time.Duration) string {
	if errors.Is(err, context.DeadlineExceeded) && timeout > 0 {
		return fmt.Sprintf("timed out after %s", timeout)
	}
	return err.Error()
}
