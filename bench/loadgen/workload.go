package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/infergate/infergate/bench/result"
)

// Workload describes the requests of a run. Item k is a pure function of
// the seed and k, so a sweep's levels, a comparison's two targets and a
// rerun with the same seed all send the same requests.
//
// Synthetic prompts are words drawn from a small vocabulary of short,
// common English words: one word is about one token for typical BPE
// tokenizers (each is a single token with its leading space in the GPT and
// Llama vocabularies), so "N input tokens" means N words, not an exact
// server-side count. The server's usage chunk reports the real count.
type Workload struct {
	Models  []result.Weight // model names; one drawn per request by weight
	Keys    []Key           // API keys (Authorization: Bearer; x-api-key for messages); none = no header
	Headers map[string]string
	Mixes   []HeaderChoice // per header name, one value drawn per request
	Input   result.Range   // prompt words, shared prefix included
	Output  result.Range   // max_tokens
	Prefix  result.Prefix  // share of requests starting with one shared prefix
	Prompt  string         // fixed user message instead of synthetic words
	Dataset []DatasetEntry // requests from a JSONL file instead of synthetic ones
	Stream  bool           // ignored by embeddings, which never stream
	NoHints bool           // omit min_tokens and ignore_eos (for servers that reject them)
	API     API            // the API spoken; zero: chat
	Seed    int64
	prefix  string // built by prepare, read-only afterwards
}

// Key is one tenant: Name labels it in reports, Key is never written out.
type Key struct {
	Name   string
	Key    string
	Weight float64
}

// HeaderChoice is one weighted value of a header that varies per request.
type HeaderChoice struct {
	Name, Value string
	Weight      float64
}

// DatasetEntry is one line of a --dataset file.
type DatasetEntry struct {
	Messages  json.RawMessage `json:"messages,omitempty"`
	Prompt    string          `json:"prompt,omitempty"`
	MaxTokens int             `json:"max_tokens,omitempty"`
	Model     string          `json:"model,omitempty"`
	words     int
}

// Request is one prepared request, identical for every target.
type Request struct {
	Item         int
	Body         []byte
	Header       http.Header
	Host         string // from a "Host" header, if any
	Model        string
	Tenant       string
	InputTokens  int // words sent (an estimate of prompt tokens)
	OutputTokens int // max_tokens asked for (0 for embeddings)
	Stream       bool
	API          API
}

type chatBody struct {
	Model         string          `json:"model"`
	Messages      json.RawMessage `json:"messages"`
	MaxTokens     int             `json:"max_tokens"`
	MinTokens     int             `json:"min_tokens,omitempty"`
	IgnoreEOS     bool            `json:"ignore_eos,omitempty"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options,omitempty"`
}

// Bodies of the other APIs. Length hints (min_tokens, ignore_eos) are
// vLLM's sampling parameters for its OpenAI chat and completions servers;
// the Responses and Anthropic APIs reject unknown fields.
type completionsBody struct {
	Model         string         `json:"model"`
	Prompt        string         `json:"prompt"`
	MaxTokens     int            `json:"max_tokens"`
	MinTokens     int            `json:"min_tokens,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type responsesBody struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	MaxOutputTokens int             `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
}

type messagesBody struct {
	Model     string          `json:"model"`
	MaxTokens int             `json:"max_tokens"`
	System    string          `json:"system,omitempty"`
	Messages  json.RawMessage `json:"messages"`
	Stream    bool            `json:"stream"`
}

type embeddingsBody struct {
	Model string `json:"model"`
	Input string `json:"input"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

func (w *Workload) validate() error {
	if len(w.Models) == 0 && len(w.Dataset) == 0 {
		return errors.New("loadgen: no model")
	}
	for _, m := range w.Models {
		if m.Value == "" || !(m.Weight > 0) {
			return fmt.Errorf("loadgen: model %q needs a name and a positive weight", m.Value)
		}
	}
	for _, k := range w.Keys {
		if k.Key == "" || !(k.Weight > 0) {
			return fmt.Errorf("loadgen: API key %q needs a value and a positive weight", k.Name)
		}
	}
	for _, h := range w.Mixes {
		if h.Name == "" || !(h.Weight > 0) {
			return fmt.Errorf("loadgen: header mix %q needs a name and a positive weight", h.Name+":"+h.Value)
		}
	}
	for _, r := range []struct {
		name string
		r    result.Range
	}{{"input", w.Input}, {"output", w.Output}} {
		if err := checkRange(r.r); err != nil {
			return fmt.Errorf("loadgen: %s tokens: %w", r.name, err)
		}
	}
	if _, err := ParseAPI(string(w.API.orDefault())); err != nil {
		return fmt.Errorf("loadgen: %w", err)
	}
	if w.Prefix.Share < 0 || w.Prefix.Share > 1 || w.Prefix.Tokens < 0 {
		return fmt.Errorf("loadgen: prefix share must be in [0,1] and its length not negative")
	}
	w.prepare()
	return nil
}

func checkRange(r result.Range) error {
	switch {
	case r.Min < 1 || r.Max < r.Min:
		return fmt.Errorf("want 1 <= min <= max, got %d..%d", r.Min, r.Max)
	case r.Dist != "uniform" && r.Dist != "normal":
		return fmt.Errorf("unknown distribution %q", r.Dist)
	case r.Dist == "normal" && (r.StdDev < 0 || math.IsNaN(r.Mean)):
		return fmt.Errorf("normal needs a mean and a non-negative stddev")
	}
	return nil
}

// prepare builds what every item shares, before Run's goroutines read it.
func (w *Workload) prepare() {
	w.prefix = ""
	if w.Prefix.Share > 0 && w.Prefix.Tokens > 0 {
		rng := rand.New(rand.NewPCG(uint64(w.Seed), streamPrefix))
		var b strings.Builder
		appendWords(&b, rng, w.Prefix.Tokens)
		w.prefix = b.String()
	}
}

// Item builds request k. It draws, in a fixed order, from an RNG seeded by
// (seed, k) alone, so items do not depend on which goroutine builds them.
func (w *Workload) Item(k int) (*Request, error) {
	rng := rand.New(rand.NewPCG(uint64(w.Seed), streamItem^uint64(k)))
	api := w.API.orDefault()
	r := &Request{Item: k, Header: make(http.Header, 4+len(w.Headers)), Stream: w.Stream && api != APIEmbeddings, API: api}
	if len(w.Models) > 0 {
		r.Model = w.Models[pick(rng, len(w.Models), func(i int) float64 { return w.Models[i].Weight })].Value
	}
	if len(w.Keys) > 0 {
		key := w.Keys[pick(rng, len(w.Keys), func(i int) float64 { return w.Keys[i].Weight })]
		r.Tenant = key.Name
		if api == APIMessages {
			r.Header.Set("x-api-key", key.Key) // as Anthropic's clients send it
		} else {
			r.Header.Set("Authorization", "Bearer "+key.Key)
		}
	}
	if api == APIMessages {
		r.Header.Set("anthropic-version", "2023-06-01")
	}
	for k, v := range w.Headers {
		if strings.EqualFold(k, "Host") {
			r.Host = v
			continue
		}
		r.Header.Set(k, v)
	}
	for _, group := range mixGroups(w.Mixes) {
		c := group[pick(rng, len(group), func(i int) float64 { return group[i].Weight })]
		if strings.EqualFold(c.Name, "Host") {
			r.Host = c.Value
			continue
		}
		r.Header.Set(c.Name, c.Value)
	}
	r.OutputTokens = draw(rng, w.Output)
	inputWords := draw(rng, w.Input)
	usePrefix := w.prefix != "" && rng.Float64() < w.Prefix.Share

	var messages []byte
	var err error
	switch {
	case len(w.Dataset) > 0:
		e := &w.Dataset[k%len(w.Dataset)]
		if e.Model != "" {
			r.Model = e.Model
		}
		if e.MaxTokens > 0 {
			r.OutputTokens = e.MaxTokens
		}
		r.InputTokens = e.words
		messages = e.Messages
		if messages == nil {
			messages, err = json.Marshal([]chatMessage{{Role: "user", Content: e.Prompt}})
		}
	case w.Prompt != "":
		r.InputTokens = len(strings.Fields(w.Prompt))
		messages, err = json.Marshal([]chatMessage{{Role: "user", Content: w.Prompt}})
	default:
		var b strings.Builder
		if usePrefix {
			b.WriteString(w.prefix)
			// The prefix counts toward the input length; at least one
			// word of the request's own keeps prompts distinct.
			inputWords = max(inputWords-w.Prefix.Tokens, 1)
			r.InputTokens = w.Prefix.Tokens
		}
		appendWords(&b, rng, inputWords)
		r.InputTokens += inputWords
		messages, err = json.Marshal([]chatMessage{{Role: "user", Content: b.String()}})
	}
	if err != nil {
		return nil, err
	}
	if r.Body, err = w.body(r, messages); err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	if r.Stream {
		r.Header.Set("Accept", "text/event-stream")
	} else {
		r.Header.Set("Accept", "application/json")
	}
	return r, nil
}

// body is r's request body in w's API, for the chat messages given.
func (w *Workload) body(r *Request, messages json.RawMessage) ([]byte, error) {
	hints := !w.NoHints
	var opts *streamOptions
	if r.Stream {
		opts = &streamOptions{IncludeUsage: true}
	}
	switch r.API {
	case APICompletions:
		b := completionsBody{Model: r.Model, Prompt: messagesText(messages, ""), MaxTokens: r.OutputTokens,
			Stream: r.Stream, StreamOptions: opts}
		if hints {
			b.MinTokens, b.IgnoreEOS = r.OutputTokens, true
		}
		return json.Marshal(b)
	case APIResponses:
		input, err := responsesInput(messages)
		if err != nil {
			return nil, err
		}
		return json.Marshal(responsesBody{Model: r.Model, Input: input, MaxOutputTokens: r.OutputTokens, Stream: r.Stream})
	case APIMessages:
		system, rest, err := splitSystem(messages)
		if err != nil {
			return nil, err
		}
		return json.Marshal(messagesBody{Model: r.Model, MaxTokens: r.OutputTokens, System: system, Messages: rest, Stream: r.Stream})
	case APIEmbeddings:
		r.OutputTokens = 0
		return json.Marshal(embeddingsBody{Model: r.Model, Input: messagesText(messages, "")})
	}
	b := chatBody{Model: r.Model, Messages: messages, MaxTokens: r.OutputTokens, Stream: r.Stream, StreamOptions: opts}
	if hints {
		// Ask for exactly max_tokens, so output lengths are the ones drawn
		// (vLLM's extra sampling parameters; OpenAI's API rejects them).
		b.MinTokens, b.IgnoreEOS = r.OutputTokens, true
	}
	return json.Marshal(b)
}

// messagesText joins the text of chat messages (of the given role, or all
// when role is empty) by newlines: the prompt of the APIs that take text.
func messagesText(messages json.RawMessage, role string) string {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	_ = json.Unmarshal(messages, &msgs) // validated by LoadDataset or built here
	var parts []string
	for _, m := range msgs {
		if role == "" || m.Role == role {
			parts = append(parts, contentText(m.Content))
		}
	}
	return strings.Join(parts, "\n")
}

// responsesInput turns chat messages into Responses input items: the same
// roles, each content as its text (the Responses API calls text parts
// input_text, not text).
func responsesInput(messages json.RawMessage) (json.RawMessage, error) {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return nil, err
	}
	items := make([]chatMessage, len(msgs))
	for i, m := range msgs {
		items[i] = chatMessage{Role: m.Role, Content: contentText(m.Content)}
	}
	return json.Marshal(items)
}

// splitSystem moves chat system messages to Anthropic's system prompt.
func splitSystem(messages json.RawMessage) (system string, rest json.RawMessage, err error) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return "", nil, err
	}
	kept := msgs[:0]
	for _, m := range msgs {
		if gjson.GetBytes(m, "role").Str == "system" {
			continue
		}
		kept = append(kept, m)
	}
	if len(kept) == len(msgs) {
		return "", messages, nil
	}
	rest, err = json.Marshal(kept)
	return messagesText(messages, "system"), rest, err
}

// mixGroups groups header choices by name, in name order, so each request
// draws one value per header in a fixed order.
func mixGroups(mixes []HeaderChoice) [][]HeaderChoice {
	if len(mixes) == 0 {
		return nil
	}
	byName := map[string][]HeaderChoice{}
	var names []string
	for _, m := range mixes {
		k := http.CanonicalHeaderKey(m.Name)
		if _, ok := byName[k]; !ok {
			names = append(names, k)
		}
		byName[k] = append(byName[k], m)
	}
	slices.Sort(names)
	groups := make([][]HeaderChoice, len(names))
	for i, n := range names {
		groups[i] = byName[n]
	}
	return groups
}

// pick returns an index drawn with probability proportional to weight(i).
func pick(rng *rand.Rand, n int, weight func(int) float64) int {
	if n == 1 {
		return 0
	}
	total := 0.0
	for i := range n {
		total += weight(i)
	}
	x := rng.Float64() * total
	for i := range n {
		if x -= weight(i); x < 0 {
			return i
		}
	}
	return n - 1
}

// draw returns a length from r: uniform on [Min, Max], or normal with r's
// mean and stddev, rounded and clamped to [Min, Max].
func draw(rng *rand.Rand, r result.Range) int {
	if r.Dist == "normal" {
		v := int(math.Round(r.Mean + r.StdDev*rng.NormFloat64()))
		return min(max(v, r.Min), r.Max)
	}
	if r.Max <= r.Min {
		return r.Min
	}
	return r.Min + rng.IntN(r.Max-r.Min+1)
}

// appendWords writes n space-separated vocabulary words.
func appendWords(b *strings.Builder, rng *rand.Rand, n int) {
	b.Grow(n * 6)
	for range n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[rng.IntN(len(vocabulary))])
	}
}

// vocabulary holds short, common English words, each a single token (with
// its leading space) in the common BPE vocabularies.
var vocabulary = strings.Fields(`
the of and to in is was he for it with as his on be at by had are but from
or have an they which one you were her all she there would their we him been
has when who will more no if out so said what up its about into than them can
only other new some could time these two may then do first any my now such
like our over man me even most made after also did many before must through
back years where much your way well down should because each just those people
how too little state good very make world still own see men work long get here
between both life being under never day same another know while last might us
great old year off come since against go came right used take three states
himself few house use during without again place around however home small
found thought went say part once general high upon school every does got
united left number course war until always away something fact though water
less public put think almost hand enough far took head yet government system
better set told nothing night end why called eyes find going look asked
later knew point next program city business give group toward young days let
room president side social given present several order national possible rather
second face per among form important often things looking early white case
become large big need four within felt along children saw best church ever least
power development light thing seemed family interest want members mind country
area others done turned although open god service problem certain kind different
thus began door help sense whole matter perhaps itself times law human line
above name example action company hands local show five history gave today either
act feet across taken past quite anything seen having death week experience body
word half really field am car words already themselves information tell together
college shall money period held keep sure probably free seems political real
behind cannot miss question air office making brought whether gone land tax
`)

// LoadDataset reads a JSONL file: one request per line, each with
// "messages" (an OpenAI chat messages array) or "prompt" (a string sent as
// one user message), and optionally "max_tokens" and "model". Blank lines
// are skipped.
func LoadDataset(path string) ([]DatasetEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []DatasetEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e DatasetEntry
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		switch {
		case len(e.Messages) > 0:
			var msgs []struct {
				Content json.RawMessage `json:"content"`
			}
			if err := json.Unmarshal(e.Messages, &msgs); err != nil || len(msgs) == 0 {
				return nil, fmt.Errorf("%s:%d: messages must be a non-empty array of messages", path, n)
			}
			for _, m := range msgs {
				e.words += contentWords(m.Content)
			}
			e.Messages = bytes.Clone(e.Messages)
		case e.Prompt != "":
			e.words = len(strings.Fields(e.Prompt))
		default:
			return nil, fmt.Errorf("%s:%d: want \"messages\" or \"prompt\"", path, n)
		}
		if e.MaxTokens < 0 {
			return nil, fmt.Errorf("%s:%d: negative max_tokens", path, n)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no requests", path)
	}
	return out, nil
}

// contentWords counts the words of a message's content: a string, or an
// array of parts whose "text" fields count.
func contentWords(raw json.RawMessage) int {
	return len(strings.Fields(contentText(raw)))
}

// contentText is a message content's text: a string, or the "text" fields
// of an array of parts, joined by spaces.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return ""
	}
	texts := make([]string, len(parts))
	for i, p := range parts {
		texts[i] = p.Text
	}
	return strings.Join(texts, " ")
}

// ParseRange reads a token-count distribution: "N" (fixed), "MIN:MAX"
// (uniform) or "normal:MEAN,STDDEV[,MIN,MAX]" (rounded, clamped to [MIN,MAX],
// by default [1, MEAN+6·STDDEV]).
func ParseRange(s string) (result.Range, error) {
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(s, "normal:"); ok {
		var f []float64
		for p := range strings.SplitSeq(rest, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
			if err != nil {
				return result.Range{}, fmt.Errorf("want normal:MEAN,STDDEV[,MIN,MAX], got %q", s)
			}
			f = append(f, v)
		}
		if len(f) != 2 && len(f) != 4 {
			return result.Range{}, fmt.Errorf("want normal:MEAN,STDDEV[,MIN,MAX], got %q", s)
		}
		r := result.Range{Dist: "normal", Mean: f[0], StdDev: f[1], Min: 1, Max: int(math.Ceil(f[0] + 6*f[1]))}
		if len(f) == 4 {
			r.Min, r.Max = int(f[2]), int(f[3])
		}
		return r, checkRange(r)
	}
	lo, hi, isRange := strings.Cut(s, ":")
	a, err := strconv.Atoi(lo)
	if err != nil {
		return result.Range{}, fmt.Errorf("want N, MIN:MAX or normal:MEAN,STDDEV[,MIN,MAX], got %q", s)
	}
	r := result.Range{Min: a, Max: a, Dist: "uniform"}
	if isRange {
		if r.Max, err = strconv.Atoi(hi); err != nil {
			return result.Range{}, fmt.Errorf("want MIN:MAX, got %q", s)
		}
	}
	return r, checkRange(r)
}

// ParseWeighted splits "a@3,b@1" (or "a,b": weight 1 each) into weighted
// values. "@" separates the weight because "=" and ":" occur in model
// names and keys.
func ParseWeighted(s string) ([]result.Weight, error) {
	var out []result.Weight
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		w := result.Weight{Value: part, Weight: 1}
		if i := strings.LastIndexByte(part, '@'); i >= 0 {
			f, err := strconv.ParseFloat(part[i+1:], 64)
			if err != nil || !(f > 0) || math.IsInf(f, 0) {
				return nil, fmt.Errorf("bad weight in %q: want VALUE@WEIGHT with a positive weight", part)
			}
			w.Value, w.Weight = part[:i], f
		}
		if w.Value == "" {
			return nil, fmt.Errorf("empty value in %q", s)
		}
		out = append(out, w)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no values in %q", s)
	}
	return out, nil
}
