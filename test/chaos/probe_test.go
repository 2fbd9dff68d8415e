package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/bench/mock"
)

// outcome is what one probe request came to.
type outcome string

const (
	exact   outcome = "exact"   // 200, every byte the pool sent, in order
	refused outcome = "refused" // a clean error: an OpenAI-style JSON error, nothing streamed
	dropped outcome = "dropped" // the connection failed before any response byte
	cut     outcome = "cut"     // a 200 stream that ended early; what arrived is a prefix of the answer
	left    outcome = "left"    // the client hung up on purpose; what arrived is a prefix of the answer
	corrupt outcome = "corrupt" // bytes that differ from the pool's answer
	hung    outcome = "hung"    // no end within the probe timeout
)

type result struct {
	outcome    outcome
	status     int
	start, end time.Time
	detail     string
	spec       probeSpec
}

// probeTimeout bounds a probe: a stream is under a second long.
const probeTimeout = 30 * time.Second

// probeSpec is one probe request and how its client behaves.
type probeSpec struct {
	i      int  // which request: its prompt and max_tokens
	stream bool // streamed (asking for usage) or one JSON answer
	key    string
	http2  bool // HTTP/2 without TLS (prior knowledge), else HTTP/1.1

	leaveAfter int           // hang up after this many body bytes (0: read it all)
	slowFor    time.Duration // read one byte a second for this long first
}

// body is the request: a chat of a few words within the tier's cap, so the
// gate forwards it unchanged and the pool's answer is the reference's.
func (s probeSpec) body() string {
	words := []string{"envoy", "gateway", "tokens", "budget", "stream", "pool", "chaos", "ledger"}
	var prompt []string
	for k := range 4 + s.i%13 {
		prompt = append(prompt, words[(s.i+k)%len(words)])
	}
	streaming := `"stream":false`
	if s.stream {
		streaming = `"stream":true,"stream_options":{"include_usage":true}`
	}
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,%s,"messages":[{"role":"user","content":%q}]}`,
		model, 8+s.i%(maxTokens-7), streaming, strings.Join(prompt, " ")+fmt.Sprintf(" #%d", s.i))
}

// expected is what a pool answers to body, byte for byte: the mock is
// deterministic, and the reference mock answers without delays.
var expected = struct {
	sync.Mutex
	srv    *mock.Server
	byBody map[string][]byte
}{srv: mock.New(mock.Config{TTFT: -1, ITL: -1}, nil), byBody: map[string][]byte{}}

func expectedAnswer(body string) []byte {
	expected.Lock()
	defer expected.Unlock()
	if b, ok := expected.byBody[body]; ok {
		return b
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("content-type", "application/json")
	expected.srv.Handler().ServeHTTP(rec, req)
	b := rec.Body.Bytes()
	expected.byBody[body] = b
	return b
}

// probe sends a request through Envoy and classifies what came back.
func (r *rig) probe(ctx context.Context, spec probeSpec) result {
	opts := &spec
	body := spec.body()
	want := expectedAnswer(body)
	res := result{start: time.Now(), spec: spec}
	defer func() { res.end = time.Now() }()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("authorization", "Bearer "+spec.key)
	req.Header.Set("content-type", "application/json")
	client := http1Client
	if spec.http2 {
		client = http2Client
	}
	resp, err := client.Do(req)
	if err != nil {
		res.outcome, res.detail = dropped, err.Error()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			res.outcome = hung
		}
		res.end = time.Now()
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string }
		}
		b, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			res.outcome, res.detail = corrupt, fmt.Sprintf("status %d without an OpenAI error: %.200q", resp.StatusCode, b)
		} else {
			res.outcome, res.detail = refused, e.Error.Code
		}
		res.end = time.Now()
		return res
	}
	var got bytes.Buffer
	if opts.slowFor > 0 {
		one := make([]byte, 1)
		for until := time.Now().Add(opts.slowFor); time.Now().Before(until); {
			n, err := resp.Body.Read(one)
			got.Write(one[:n])
			if err != nil {
				break
			}
			time.Sleep(time.Second)
		}
	}
	var src io.Reader = resp.Body
	if opts.leaveAfter > 0 {
		src = io.LimitReader(resp.Body, int64(opts.leaveAfter-got.Len()))
	}
	_, err = io.Copy(&got, src)
	res.end = time.Now()
	switch {
	case !bytes.HasPrefix(want, got.Bytes()):
		res.outcome, res.detail = corrupt, fmt.Sprintf("byte %d differs", commonPrefix(want, got.Bytes()))
	case opts.leaveAfter > 0 && got.Len() == opts.leaveAfter && got.Len() < len(want):
		res.outcome = left
	case got.Len() == len(want) && err == nil:
		res.outcome = exact
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		res.outcome, res.detail = hung, fmt.Sprintf("%d of %d bytes", got.Len(), len(want))
	default:
		res.outcome, res.detail = cut, fmt.Sprintf("%d of %d bytes: %v", got.Len(), len(want), err)
	}
	return res
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// The probes' clients: HTTP/1.1, and HTTP/2 over plain TCP (prior
// knowledge, as gRPC-style and many SDK clients inside a mesh speak it).
var (
	http1Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Second}}
	http2Client = &http.Client{Transport: func() *http.Transport {
		t := &http.Transport{IdleConnTimeout: time.Second, Protocols: new(http.Protocols)}
		t.Protocols.SetUnencryptedHTTP2(true)
		return t
	}()}
)
