package mock

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxOutputTokens bounds one response; beyond it a non-streaming body would
// be unreasonably large and a streaming one would effectively never end.
const maxOutputTokens = 1 << 20

// maxOverrideMillis bounds the timing override headers (one hour), far above
// any test need, so a typo cannot park a handler for days.
const maxOverrideMillis = 3_600_000

// maxChoices bounds n, as OpenAI's API does (128) and well beyond any test.
const maxChoices = 128

// maxPromptLogprobs bounds prompt_logprobs, as vLLM's max_logprobs (20) does.
const maxPromptLogprobs = 20

// kind distinguishes the inference APIs, which share parsing, scheduling
// and content but differ in wire format.
type kind int

const (
	kindChat        kind = iota // OpenAI /v1/chat/completions
	kindText                    // OpenAI /v1/completions
	kindResponses               // OpenAI /v1/responses
	kindMessages                // Anthropic /v1/messages
	kindCountTokens             // Anthropic /v1/messages/count_tokens
	kindEmbeddings              // OpenAI /v1/embeddings
)

// label is the endpoint label value of infergate_mock_requests_total.
func (k kind) label() string {
	return [...]string{"chat_completions", "completions", "responses", "messages", "count_tokens", "embeddings"}[k]
}

func (k kind) idPrefix() string {
	return [...]string{"chatcmpl-", "cmpl-", "resp_", "msg_", "", ""}[k]
}

// anthropic reports whether k answers in Anthropic's formats.
func (k kind) anthropic() bool { return k == kindMessages || k == kindCountTokens }

// request holds the fields of a request the mock acts on, for every API;
// any other field is ignored and, importantly, does not influence the
// response. Each API reads only its own fields (see completion.input).
type request struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`     // chat, messages
	Prompt              json.RawMessage `json:"prompt"`       // completions
	Input               json.RawMessage `json:"input"`        // responses, embeddings
	Instructions        json.RawMessage `json:"instructions"` // responses
	System              json.RawMessage `json:"system"`       // messages
	MaxTokens           int             `json:"max_tokens"`   // chat, completions, messages
	MaxCompletionTokens int             `json:"max_completion_tokens"`
	MaxOutputTokens     int             `json:"max_output_tokens"` // responses
	Dimensions          int             `json:"dimensions"`        // embeddings
	EncodingFormat      string          `json:"encoding_format"`   // embeddings
	Stream              bool            `json:"stream"`
	N                   int             `json:"n"`               // chat, completions: choices
	Background          bool            `json:"background"`      // responses (see Server.background)
	PromptLogprobs      int             `json:"prompt_logprobs"` // chat, completions: vLLM's, written after usage
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// requestError is a client error found while interpreting a request.
type requestError struct {
	code    string
	message string
}

func parseRequest(k kind, body []byte) (request, *requestError) {
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		return request{}, &requestError{"invalid_json", "invalid JSON body: " + err.Error()}
	}
	if k == kindEmbeddings || k == kindCountTokens {
		req.Stream = false // neither streams, whatever the body says
	}
	if req.Model == "" {
		return req, &requestError{"missing_model", "you must provide a model parameter"}
	}
	return req, nil
}

// params are the cadence and fault settings for one request: the server
// config and faults with any x-mock-* header overrides applied.
type params struct {
	ttft           time.Duration
	itl            time.Duration
	tokensPerEvent int
	tokens         int  // output tokens forced by x-mock-tokens; 0 = from the request
	cachedTokens   int  // x-mock-cached-tokens: prompt tokens the usage reports read from the cache
	largestCap     bool // x-mock-output-cap: largest, the largest output cap the body names wins
	status         int  // status injected by x-mock-status; 0 = complete normally
	retryAfter     time.Duration
	faults         streamFaults
	emitTimestamps bool
	lockstep       *Lockstep // x-mock-lockstep's gate; nil: stream freely
	usageUnseen    bool      // x-mock-lockstep-unseen: usage
}

func (s *Server) parseParams(h http.Header) (params, error) {
	cfg, f := s.cfg.Load(), s.faults.Load()
	p := params{
		ttft: cfg.TTFT, itl: cfg.ITL, tokensPerEvent: cfg.TokensPerEvent,
		retryAfter: f.RetryAfter, emitTimestamps: cfg.EmitTimestamps,
		faults: streamFaults{
			stallAfter: f.StallAfter, stall: f.Stall,
			resetAfter: f.ResetAfter, malformedAfter: f.MalformedAfter,
		},
	}
	if v, ok, err := intHeader(h, "x-mock-ttft-ms", 0, maxOverrideMillis); err != nil {
		return p, err
	} else if ok {
		p.ttft = time.Duration(v) * time.Millisecond
	}
	if v, ok, err := intHeader(h, "x-mock-itl-ms", 0, maxOverrideMillis); err != nil {
		return p, err
	} else if ok {
		p.itl = time.Duration(v) * time.Millisecond
	}
	if v, ok, err := intHeader(h, "x-mock-tokens-per-event", 1, maxOutputTokens); err != nil {
		return p, err
	} else if ok {
		p.tokensPerEvent = v
	}
	if v, ok, err := intHeader(h, "x-mock-tokens", 1, maxOutputTokens); err != nil {
		return p, err
	} else if ok {
		p.tokens = v
	}
	if v, ok, err := intHeader(h, "x-mock-cached-tokens", 0, maxOutputTokens); err != nil {
		return p, err
	} else if ok {
		p.cachedTokens = v
	}
	if v, ok, err := intHeader(h, "x-mock-status", 400, 599); err != nil {
		return p, err
	} else if ok {
		p.status = v
	}
	if v, ok, err := intHeader(h, "x-mock-retry-after-ms", 0, maxOverrideMillis); err != nil {
		return p, err
	} else if ok {
		p.retryAfter = time.Duration(v) * time.Millisecond
	}
	if v, ok, err := intHeader(h, "x-mock-stall-ms", 0, maxOverrideMillis); err != nil {
		return p, err
	} else if ok {
		p.faults.stall = time.Duration(v) * time.Millisecond
	}
	// Token positions accept 0 so that a request can opt out of a fault
	// set for the whole server.
	for _, f := range []struct {
		name string
		dst  *int
	}{
		{"x-mock-stall-after", &p.faults.stallAfter},
		{"x-mock-reset-after", &p.faults.resetAfter},
		{"x-mock-malformed-after", &p.faults.malformedAfter},
	} {
		if v, ok, err := intHeader(h, f.name, 0, maxOutputTokens); err != nil {
			return p, err
		} else if ok {
			*f.dst = v
		}
	}
	switch raw := h.Get("x-mock-output-cap"); raw {
	case "":
	case "largest":
		// A server that reads another cap key than the gateway did: the
		// largest of them is what it may write.
		p.largestCap = true
	default:
		return p, fmt.Errorf("invalid x-mock-output-cap header %q: want largest", raw)
	}
	if raw := h.Get("x-mock-emit-timestamps"); raw != "" {
		v, err := strconv.ParseBool(strings.TrimSpace(raw))
		if err != nil {
			return p, fmt.Errorf("invalid x-mock-emit-timestamps header %q: want 1 or 0", raw)
		}
		p.emitTimestamps = v
	}
	switch v := h.Get("x-mock-lockstep-unseen"); v {
	case "":
	case "usage":
		p.usageUnseen = true
	default:
		return p, fmt.Errorf("invalid x-mock-lockstep-unseen header %q: want usage", v)
	}
	var err error
	p.lockstep, err = s.lockstepOf(h)
	return p, err
}

// intHeader parses an optional integer header within [lo, hi].
func intHeader(h http.Header, name string, lo, hi int) (v int, ok bool, err error) {
	raw := h.Get(name)
	if raw == "" {
		return 0, false, nil
	}
	v, err = strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || v < lo || v > hi {
		return 0, false, fmt.Errorf("invalid %s header %q: want an integer in [%d, %d]", name, raw, lo, hi)
	}
	return v, true, nil
}

// completion is everything needed to render one response, fixed before the
// first byte is written.
type completion struct {
	kind           kind
	id             string
	created        int64
	model          string
	promptTokens   int
	cachedTokens   int // the part of promptTokens the usage reports cached (x-mock-cached-tokens)
	outputTokens   int
	tokensPerEvent int
	includeUsage   bool
	wordSeed       uint64
	sched          schedule

	// Echoed by the Responses API.
	instructions    *string
	maxOutputTokens *int

	// Embeddings: each input's tokens, the vector length and base64 output.
	embedInputs [][]string
	dimensions  int
	base64      bool

	// Capacity model and faults; see start and Server.play.
	ttft           time.Duration
	perToken       time.Duration // prefill per uncached prompt token
	itlPerBatch    time.Duration
	blocks         []uint64 // prefix cache keys; nil when the cache is off
	faults         streamFaults
	emitTimestamps bool
	lockstep       *Lockstep // nil: not a lock-step stream
	usageUnseen    bool      // the client will not see the usage event: the mock acknowledges it

	// The ledger's record (see ledger.go): prompt tokens billed at
	// admission, output tokens decoded so far.
	prompted, decoded int
	choices           int  // n: chat and completions write each token once per choice
	background        bool // a Responses request answered at once (see Server.background)
	promptLogprobsN   int  // vLLM's prompt_logprobs, after usage in a non-streamed answer
}

func newCompletion(k kind, req request, p params, cfg Config, t0 time.Time) (*completion, *requestError) {
	output := cfg.MaxTokens
	switch {
	case k == kindEmbeddings || k == kindCountTokens:
		output = 0
	case p.tokens > 0:
		output = p.tokens
	case p.largestCap && max(req.MaxTokens, req.MaxCompletionTokens, req.MaxOutputTokens) > 0:
		output = max(req.MaxTokens, req.MaxCompletionTokens, req.MaxOutputTokens)
	case k == kindResponses && req.MaxOutputTokens > 0:
		output = req.MaxOutputTokens
	case (k == kindChat || k == kindText) && req.MaxCompletionTokens > 0:
		output = req.MaxCompletionTokens
	case k != kindResponses && req.MaxTokens > 0: // chat, completions, messages
		output = req.MaxTokens
	}
	if output > maxOutputTokens {
		return nil, &requestError{"invalid_max_tokens", fmt.Sprintf("max tokens %d exceeds the mock's limit of %d", output, maxOutputTokens)}
	}

	c := &completion{kind: k, model: req.Model, outputTokens: output, choices: 1}
	input, words, apiErr := c.input(req)
	if apiErr != nil {
		return nil, apiErr
	}
	prompt := max(len(words), 1)
	var blocks []uint64
	if cfg.PrefixCacheTokens > 0 {
		blocks = blockHashes(req.Model, words)
	}

	sum := digest(k, req.Model, input, output)
	first := t0.Add(p.ttft + time.Duration(prompt)*cfg.TTFTPerPromptToken)
	c.id = k.idPrefix() + hex.EncodeToString(sum[:12])
	c.created = 1_700_000_000 + int64(binary.BigEndian.Uint64(sum[0:8])%1_000_000)
	c.promptTokens = prompt
	c.cachedTokens = min(p.cachedTokens, prompt)
	c.tokensPerEvent = p.tokensPerEvent
	c.includeUsage = req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	c.wordSeed = binary.BigEndian.Uint64(sum[8:16])
	c.sched = schedule{
		t0:     t0,
		first:  first,
		itl:    p.itl,
		jitter: cfg.Jitter,
		seed:   binary.BigEndian.Uint64(sum[16:24]),
	}
	c.ttft = p.ttft
	c.perToken = cfg.TTFTPerPromptToken
	c.itlPerBatch = cfg.ITLPerBatch
	c.blocks = blocks
	c.faults = p.faults
	c.emitTimestamps = p.emitTimestamps
	c.lockstep, c.usageUnseen = p.lockstep, p.usageUnseen
	c.background = k == kindResponses && req.Background && !req.Stream
	if k == kindChat || k == kindText {
		c.choices = min(max(req.N, 1), maxChoices)
	}
	if k == kindChat || k == kindText {
		c.promptLogprobsN = min(max(req.PromptLogprobs, 0), maxPromptLogprobs)
	}
	if k == kindEmbeddings {
		// No output tokens: the mid-stream faults have nothing to hit.
		c.faults = streamFaults{}
	}
	return c, nil
}

// input canonicalizes the request's prompt for c's API, returning what the
// digest hashes and the prompt's words (the mock's prompt tokens: words
// split on whitespace, token ids one each), and sets c's API-specific
// fields.
func (c *completion) input(req request) (canonical any, words []string, _ *requestError) {
	var ok bool
	switch c.kind {
	case kindChat:
		if canonical, words, ok = messagesInput(req.Messages); !ok {
			return nil, nil, &requestError{"invalid_messages", "messages must be an array of message objects"}
		}
	case kindText:
		if canonical, words, ok = promptInput(req.Prompt); !ok {
			return nil, nil, &requestError{"invalid_prompt", "prompt must be a string, an array of strings or an array of token ids"}
		}
	case kindResponses:
		var instructions string
		if isPresent(req.Instructions) {
			if json.Unmarshal(req.Instructions, &instructions) != nil {
				return nil, nil, &requestError{"invalid_instructions", "instructions must be a string"}
			}
			c.instructions = &instructions
		}
		if req.MaxOutputTokens > 0 {
			c.maxOutputTokens = &req.MaxOutputTokens
		}
		var in any
		if in, words, ok = responsesInput(req.Input); !ok {
			return nil, nil, &requestError{"invalid_input", "input must be a string or an array of input items"}
		}
		words = append(strings.Fields(instructions), words...)
		canonical = map[string]any{"instructions": c.instructions, "input": in}
	case kindMessages, kindCountTokens:
		if !isPresent(req.Messages) {
			return nil, nil, &requestError{"invalid_messages", "messages: field required"}
		}
		var sys, msgs any
		if sys, words, ok = systemInput(req.System); !ok {
			return nil, nil, &requestError{"invalid_system", "system must be a string or an array of text blocks"}
		}
		var more []string
		if msgs, more, ok = messagesInput(req.Messages); !ok {
			return nil, nil, &requestError{"invalid_messages", "messages must be an array of message objects"}
		}
		words = append(words, more...)
		canonical = map[string]any{"system": sys, "messages": msgs}
	case kindEmbeddings:
		in, inputs, ok := embeddingInput(req.Input)
		if !ok {
			return nil, nil, &requestError{"invalid_input", "input must be a non-empty string, array of strings, array of token ids or array of token id arrays"}
		}
		switch req.EncodingFormat {
		case "", "float":
		case "base64":
			c.base64 = true
		default:
			return nil, nil, &requestError{"invalid_encoding_format", "encoding_format must be float or base64"}
		}
		c.dimensions = defaultEmbeddingDimensions
		if req.Dimensions != 0 {
			if req.Dimensions < 1 || req.Dimensions > maxEmbeddingDimensions {
				return nil, nil, &requestError{"invalid_dimensions", fmt.Sprintf("dimensions must be in [1, %d]", maxEmbeddingDimensions)}
			}
			c.dimensions = req.Dimensions
		}
		c.embedInputs = inputs
		for _, in := range inputs {
			words = append(words, in...)
		}
		canonical = map[string]any{"input": in, "dimensions": c.dimensions, "base64": c.base64}
	}
	return canonical, words, nil
}

// start anchors the schedule at the request's admission into the batch,
// with cached prompt tokens skipping prefill. Admitted on arrival with
// nothing cached, the schedule is the one newCompletion set.
func (c *completion) start(admitted time.Time, cached int) {
	c.sched.t0 = admitted
	uncached := max(c.promptTokens-cached, 1)
	c.sched.first = admitted.Add(c.ttft + time.Duration(uncached)*c.perToken)
}

// itl is the gap before the next content event with b requests running.
func (c *completion) itl(b int64) time.Duration {
	return c.sched.itl + time.Duration(max(b-1, 0))*c.itlPerBatch
}

// events is the number of content events; the last may carry fewer than
// tokensPerEvent tokens.
func (c *completion) events() int {
	return (c.outputTokens + c.tokensPerEvent - 1) / c.tokensPerEvent
}

func (c *completion) words() *wordSource {
	return &wordSource{rng: splitMix64{state: c.wordSeed}}
}

// digest hashes the request's semantic content. Inputs are decoded and
// re-encoded first: encoding/json sorts map keys and drops insignificant
// whitespace, so a gateway that re-serializes the body (or injects fields
// such as stream_options) does not change the id or the content.
func digest(k kind, model string, input any, outputTokens int) [32]byte {
	b, err := json.Marshal(struct {
		Endpoint     string `json:"endpoint"`
		Model        string `json:"model"`
		Input        any    `json:"input"`
		OutputTokens int    `json:"output_tokens"`
	}{k.label(), model, input, outputTokens})
	if err != nil {
		// Unreachable: input was produced by json.Unmarshal into any.
		panic("mock: encoding digest input: " + err.Error())
	}
	return sha256.Sum256(b)
}

// messagesInput canonicalizes chat messages and returns their prompt words,
// the mock's prompt tokens.
func messagesInput(raw json.RawMessage) (canonical any, words []string, ok bool) {
	if !isPresent(raw) {
		return nil, nil, true
	}
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, nil, false
	}
	for _, m := range msgs {
		words = appendContentWords(words, m.Content)
	}
	if err := json.Unmarshal(raw, &canonical); err != nil {
		return nil, nil, false
	}
	return canonical, words, true
}

// appendContentWords appends the words of a message content that is either
// a string or an array of parts; only text parts count, other part types and
// shapes are ignored rather than rejected, as the mock has no use for them.
func appendContentWords(words []string, raw json.RawMessage) []string {
	if !isPresent(raw) {
		return words
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return append(words, strings.Fields(s)...)
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return words
	}
	for _, p := range parts {
		// Chat and Anthropic text parts, the Responses API's input and
		// output text.
		if p.Type == "text" || p.Type == "input_text" || p.Type == "output_text" {
			words = append(words, strings.Fields(p.Text)...)
		}
	}
	return words
}

// responsesInput canonicalizes a Responses API input, a string or an array
// of items, and returns its words: those of each item's content (a string
// or text parts); items without content (tool outputs, ...) count none.
func responsesInput(raw json.RawMessage) (canonical any, words []string, ok bool) {
	if !isPresent(raw) {
		return nil, nil, true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, strings.Fields(s), true
	}
	var items []struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return nil, nil, false
	}
	for _, it := range items {
		words = appendContentWords(words, it.Content)
	}
	if json.Unmarshal(raw, &canonical) != nil {
		return nil, nil, false
	}
	return canonical, words, true
}

// systemInput canonicalizes an Anthropic system prompt, a string or an
// array of text blocks, and returns its words.
func systemInput(raw json.RawMessage) (canonical any, words []string, ok bool) {
	if !isPresent(raw) {
		return nil, nil, true
	}
	var blocks []json.RawMessage
	if json.Unmarshal(raw, &blocks) == nil {
		for _, b := range blocks {
			var o map[string]json.RawMessage
			if json.Unmarshal(b, &o) != nil {
				return nil, nil, false
			}
		}
	} else {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return nil, nil, false
		}
	}
	if json.Unmarshal(raw, &canonical) != nil {
		return nil, nil, false
	}
	return canonical, appendContentWords(nil, raw), true
}

// embeddingInput canonicalizes an embeddings input and returns each input's
// tokens: words of a string, or the token ids themselves. An empty input,
// or an empty string among them, is refused, as OpenAI does.
func embeddingInput(raw json.RawMessage) (canonical any, inputs [][]string, ok bool) {
	var s string
	var strs []string
	var ids []int64
	var idss [][]int64
	var ss []string
	switch {
	case !isPresent(raw):
		return nil, nil, false
	case json.Unmarshal(raw, &s) == nil:
		ss = []string{s}
	case json.Unmarshal(raw, &strs) == nil:
		ss = strs // a failed Unmarshal may still fill its target
	case json.Unmarshal(raw, &ids) == nil:
		idss = [][]int64{ids}
	case json.Unmarshal(raw, &idss) == nil:
	default:
		return nil, nil, false
	}
	for _, s := range ss {
		if s == "" {
			return nil, nil, false
		}
		inputs = append(inputs, strings.Fields(s))
	}
	for _, ids := range idss {
		if len(ids) == 0 {
			return nil, nil, false
		}
		tokens := make([]string, len(ids))
		for i, id := range ids {
			tokens[i] = strconv.FormatInt(id, 10)
		}
		inputs = append(inputs, tokens)
	}
	if len(inputs) == 0 || json.Unmarshal(raw, &canonical) != nil {
		return nil, nil, false
	}
	return canonical, inputs, true
}

// promptInput canonicalizes a legacy completions prompt and returns its
// tokens: words for text prompts, the ids themselves for pre-tokenized ones.
func promptInput(raw json.RawMessage) (canonical any, tokens []string, ok bool) {
	if !isPresent(raw) {
		return nil, nil, true
	}
	var s string
	var ss []string
	var ids []int64
	switch {
	case json.Unmarshal(raw, &s) == nil:
		tokens = strings.Fields(s)
	case json.Unmarshal(raw, &ss) == nil:
		for _, p := range ss {
			tokens = append(tokens, strings.Fields(p)...)
		}
	case json.Unmarshal(raw, &ids) == nil:
		tokens = make([]string, len(ids))
		for i, id := range ids {
			tokens[i] = strconv.FormatInt(id, 10)
		}
	default:
		return nil, nil, false
	}
	if err := json.Unmarshal(raw, &canonical); err != nil {
		return nil, nil, false
	}
	return canonical, tokens, true
}

// isPresent reports whether a raw field was set to something other than null.
func isPresent(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// schedule maps content event k to its absolute emission deadline:
// first + k·ITL, plus a per-event jitter that is a pure function of the
// request, so a repeated request repeats its timing too.
type schedule struct {
	t0     time.Time
	first  time.Time // t0 + TTFT + prefill
	itl    time.Duration
	jitter time.Duration
	seed   uint64
}

func (s schedule) deadline(k int) time.Time {
	return s.jittered(k, s.first.Add(time.Duration(k)*s.itl))
}

// jittered applies event k's jitter to its un-jittered deadline d.
func (s schedule) jittered(k int, d time.Time) time.Time {
	if s.jitter <= 0 {
		return d
	}
	// Random access by k (rather than one sequential PRNG) keeps event k's
	// jitter a pure function of the request, whichever events the caller
	// visited before (the non-streaming path skips to the last one).
	r := (&splitMix64{state: s.seed + uint64(k)*splitMixGamma}).next()
	d = d.Add(time.Duration(r%uint64(2*s.jitter+1)) - s.jitter)
	if d.Before(s.t0) {
		d = s.t0
	}
	return d
}

// vocabulary is a read-only table of the words content is drawn from. Its
// length is a power of two so that reducing a PRNG output modulo it is
// unbiased, and no word needs JSON escaping.
var vocabulary = [64]string{
	"alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
	"india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa",
	"quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
	"yankee", "zulu", "amber", "basalt", "cobalt", "dune", "ember", "fjord",
	"granite", "harbor", "island", "jasper", "kelp", "lagoon", "meadow", "nectar",
	"orchid", "pebble", "quartz", "river", "saffron", "tundra", "umber", "valley",
	"willow", "yarrow", "zephyr", "anchor", "beacon", "canyon", "drift", "estuary",
	"forest", "glacier", "horizon", "inlet", "jetty", "knoll", "lantern", "mesa",
}

// wordSource yields the deterministic token sequence of one response. Each
// token is a word plus a trailing space, so token counts are exact when the
// content is split on whitespace.
type wordSource struct {
	rng splitMix64
}

func (w *wordSource) next(n int) string {
	var b strings.Builder
	b.Grow(n * 8)
	for range n {
		b.WriteString(vocabulary[w.rng.next()%uint64(len(vocabulary))])
		b.WriteByte(' ')
	}
	return b.String()
}

const splitMixGamma = 0x9e3779b97f4a7c15

// splitMix64 is a tiny PRNG with a fixed, documented algorithm. It is used
// instead of math/rand so that content never changes with the Go version.
type splitMix64 struct {
	state uint64
}

func (s *splitMix64) next() uint64 {
	s.state += splitMixGamma
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
