// Package loadgen is a minimal closed-loop load generator for
// OpenAI-compatible streaming chat completions. It measures what a client
// sees: time to first token (TTFT), the gaps between content events
// (inter-token latency, ITL) and end-to-end latency (E2E).
//
// Several targets are driven by the same workers, interleaved request by
// request, so that on a noisy machine every target sees the same conditions
// and a side-by-side comparison measures the targets rather than the moment
// each one happened to run.
package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ChatPath is appended to each Target's URL.
const ChatPath = "/v1/chat/completions"

// maxErrorBody bounds how much of a non-2xx body is read for its message.
const maxErrorBody = 64 << 10

// Target is one endpoint under test.
type Target struct {
	Name string `json:"name"` // label in results; must be unique within a run
	URL  string `json:"url"`  // base URL, e.g. http://127.0.0.1:10000; requests go to URL+ChatPath
}

// Options configures Run.
type Options struct {
	Targets     []Target
	Model       string
	Concurrency int // closed loop: this many workers, shared by all targets
	Requests    int // per target
	MaxTokens   int
	Prompt      string
	Headers     map[string]string // sent on every request; "Host" sets the request's Host
	Timeout     time.Duration     // per request, including the whole stream; 0 means none

	// OnSample, if set, is called after each request completes (for
	// progress reporting). It is called from several goroutines at once.
	OnSample func(Sample)
}

// Sample is one request as the client saw it. Start is taken just before
// the request is sent; TTFT and E2E are measured from Start.
type Sample struct {
	Target       string          `json:"target"`
	Start        time.Time       `json:"start"`
	TTFT         time.Duration   `json:"ttft_ns"`         // to the first event with non-empty choices[0].delta.content
	E2E          time.Duration   `json:"e2e_ns"`          // to "data: [DONE]" (or the end of the body)
	Gaps         []time.Duration `json:"gaps_ns"`         // between consecutive content-bearing events
	OutputTokens int             `json:"output_tokens"`   // usage.completion_tokens if sent, else content events
	Status       int             `json:"status"`          // HTTP status; 0 if no response arrived
	Err          string          `json:"error,omitempty"` // empty on success
	Bytes        int             `json:"bytes"`           // response body bytes read
}

// Run sends opts.Requests streaming chat completions to each target, using
// opts.Concurrency workers in a closed loop. Worker i sends its k-th request
// to target (i+k) % len(Targets), moving on to the next target with requests
// left once one has had its share, so each target gets exactly Requests.
//
// The result maps each target's name to its samples, sorted by Start. If ctx
// ends early, Run stops, drops the requests it aborted (they say nothing
// about the target) and returns what it has with ctx's error.
func Run(ctx context.Context, opts Options) (map[string][]Sample, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(chatRequest{
		Model:         opts.Model,
		Messages:      []chatMessage{{Role: "user", Content: opts.Prompt}},
		MaxTokens:     opts.MaxTokens,
		Stream:        true,
		StreamOptions: streamOptions{IncludeUsage: true},
	})
	if err != nil {
		return nil, err
	}
	n := len(opts.Targets)
	client := newClient(opts.Concurrency * n)
	defer client.CloseIdleConnections()

	remaining := make([]atomic.Int64, n)
	for i := range remaining {
		remaining[i].Store(int64(opts.Requests))
	}
	claim := func(preferred int) (int, bool) {
		for j := range n {
			t := (preferred + j) % n
			if remaining[t].Add(-1) >= 0 {
				return t, true
			}
		}
		return 0, false
	}

	var mu sync.Mutex
	out := make(map[string][]Sample, n)
	var wg sync.WaitGroup
	for i := range opts.Concurrency {
		wg.Go(func() {
			for k := 0; ctx.Err() == nil; k++ {
				t, ok := claim(i + k)
				if !ok {
					return
				}
				s := doRequest(ctx, client, &opts, opts.Targets[t], body)
				if s.Err != "" && ctx.Err() != nil {
					return // aborted by the caller
				}
				if opts.OnSample != nil {
					opts.OnSample(s)
				}
				mu.Lock()
				out[s.Target] = append(out[s.Target], s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, ss := range out {
		slices.SortFunc(ss, func(a, b Sample) int { return a.Start.Compare(b.Start) })
	}
	return out, ctx.Err()
}

func (o *Options) validate() error {
	if len(o.Targets) == 0 {
		return errors.New("loadgen: no targets")
	}
	seen := make(map[string]bool, len(o.Targets))
	for _, t := range o.Targets {
		if t.Name == "" || t.URL == "" {
			return fmt.Errorf("loadgen: target %q needs a name and a URL", t.Name+"="+t.URL)
		}
		if seen[t.Name] {
			return fmt.Errorf("loadgen: duplicate target name %q", t.Name)
		}
		seen[t.Name] = true
	}
	switch {
	case o.Model == "":
		return errors.New("loadgen: no model")
	case o.Concurrency < 1:
		return fmt.Errorf("loadgen: concurrency must be at least 1, got %d", o.Concurrency)
	case o.Requests < 1:
		return fmt.Errorf("loadgen: requests must be at least 1, got %d", o.Requests)
	case o.MaxTokens < 1:
		return fmt.Errorf("loadgen: max tokens must be at least 1, got %d", o.MaxTokens)
	case o.Timeout < 0:
		return fmt.Errorf("loadgen: negative timeout %s", o.Timeout)
	}
	return nil
}

// newClient returns a keep-alive HTTP/1.1 client able to hold one idle
// connection per worker per target, so steady state opens no connections.
// Proxies and compression are off: the tool measures the target, directly.
func newClient(conns int) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{Transport: &http.Transport{
		DialContext:           dialer.DialContext,
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}}
}

type chatRequest struct {
	Model         string        `json:"model"`
	Messages      []chatMessage `json:"messages"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// streamChunk is the part of a chat.completion.chunk the client needs.
type streamChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// doRequest sends one request and reads its stream to the end.
func doRequest(ctx context.Context, client *http.Client, opts *Options, t Target, body []byte) Sample {
	s := Sample{Target: t.Name}
	if opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(t.URL, "/")+ChatPath, bytes.NewReader(body))
	if err != nil {
		s.Start = time.Now()
		s.Err = err.Error()
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range opts.Headers {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}

	s.Start = time.Now()
	resp, err := client.Do(req)
	if err != nil {
		s.E2E = time.Since(s.Start)
		s.Err = describe(err, opts.Timeout)
		return s
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode
	cr := &countingReader{r: resp.Body}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		b, _ := io.ReadAll(io.LimitReader(cr, maxErrorBody))
		s.E2E = time.Since(s.Start)
		s.Bytes = cr.n
		s.Err = httpError(resp.StatusCode, b)
		return s
	}
	s.Gaps = make([]time.Duration, 0, opts.MaxTokens)
	s.readStream(cr, opts.Timeout)
	s.Bytes = cr.n
	return s
}

// readStream parses server-sent events line by line, timing each event when
// the blank line that ends it arrives.
func (s *Sample) readStream(cr *countingReader, timeout time.Duration) {
	br := bufio.NewReaderSize(cr, 16<<10)
	var (
		line, data  []byte
		pending     bool // data holds an event not yet dispatched
		done        bool
		last        time.Time
		events      int
		usageTokens = -1
		err         error
	)
	dispatch := func() bool { // reports whether to keep reading
		pending = false
		now := time.Now()
		if string(data) == "[DONE]" {
			done = true
			s.E2E = now.Sub(s.Start)
			return false
		}
		var c streamChunk
		if err := json.Unmarshal(data, &c); err != nil {
			s.Err = "malformed stream event: " + truncate(string(data), 200)
			return false
		}
		if c.Error != nil {
			s.Err = "error event in stream: " + c.Error.Message
			return false
		}
		if c.Usage != nil {
			usageTokens = c.Usage.CompletionTokens
		}
		if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
			if events == 0 {
				s.TTFT = now.Sub(s.Start)
			} else {
				s.Gaps = append(s.Gaps, now.Sub(last))
			}
			last = now
			events++
		}
		return true
	}

	for err == nil {
		line, err = readLine(br, line)
		l := bytes.TrimRight(line, "\r\n")
		switch {
		case len(l) == 0:
			if pending && !dispatch() {
				err = errStop
			}
		case bytes.HasPrefix(l, []byte("data:")):
			v := bytes.TrimPrefix(l[len("data:"):], []byte(" "))
			if pending {
				data = append(data, '\n')
			} else {
				data = data[:0]
			}
			data = append(data, v...)
			pending = true
		}
		// Comments (":...") and other fields (event, id, retry) are ignored.
	}
	if pending && errors.Is(err, io.EOF) {
		dispatch() // a last event without its blank line
	}
	if done {
		// Drain the little that follows [DONE] so the connection is reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(br, maxErrorBody))
	} else if s.E2E == 0 {
		s.E2E = time.Since(s.Start)
	}

	s.OutputTokens = events
	if usageTokens >= 0 {
		s.OutputTokens = usageTokens
	}
	switch {
	case s.Err != "":
	case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, errStop):
		s.Err = "reading stream: " + describe(err, timeout)
	case !done:
		s.Err = "stream ended without data: [DONE]"
	case events == 0:
		s.Err = "stream carried no content"
	}
}

var errStop = errors.New("stop")

// readLine returns the next line including its newline; buf is reused for
// lines longer than br's buffer. The result is valid until the next call.
func readLine(br *bufio.Reader, buf []byte) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return line, err
	}
	buf = append(buf[:0], line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		line, err = br.ReadSlice('\n')
		buf = append(buf, line...)
	}
	return buf, err
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// httpError describes a non-2xx response, using an OpenAI-style
// {"error":{"message":...}} body when there is one.
func httpError(status int, body []byte) string {
	var e struct {
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := strings.TrimSpace(string(body))
	if json.Unmarshal(body, &e) == nil && e.Error != nil && e.Error.Message != "" {
		msg = e.Error.Message
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
