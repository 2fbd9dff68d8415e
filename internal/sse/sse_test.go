package sse

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// event is a retained copy of an Event: the parser's Data is only valid
// during the callback.
type event struct {
	Data string
	Done bool
}

func (e event) String() string { return fmt.Sprintf("{%q done=%t}", e.Data, e.Done) }

func collect(dst *[]event) func(Event) {
	return func(e Event) { *dst = append(*dst, event{string(e.Data), e.Done}) }
}

// feedAll feeds chunks in order, then flushes, and returns every event.
func feedAll(p *Parser, chunks ...string) []event {
	var got []event
	emit := collect(&got)
	for _, c := range chunks {
		p.Feed([]byte(c), emit)
	}
	p.Flush(emit)
	return got
}

// A realistic OpenAI chat completion stream: role chunk, content chunks,
// usage chunk (include_usage), then the [DONE] sentinel.
const (
	roleChunk    = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}`
	contentChunk = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}`
	finishChunk  = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}`
	usageChunk   = `{"id":"chatcmpl-9x","object":"chat.completion.chunk","created":1718000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}`
)

func openAIStream(eol string) string {
	var b strings.Builder
	for _, d := range []string{roleChunk, contentChunk, contentChunk, finishChunk, usageChunk, "[DONE]"} {
		b.WriteString("data: " + d + eol + eol)
	}
	return b.String()
}

func openAIEvents() []event {
	return []event{
		{roleChunk, false}, {contentChunk, false}, {contentChunk, false},
		{finishChunk, false}, {usageChunk, false}, {"[DONE]", true},
	}
}

func TestParser(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   []event
	}{
		{
			name:   "one event per chunk",
			chunks: []string{"data: a\n\n", "data: b\n\n", "data: [DONE]\n\n"},
			want:   []event{{"a", false}, {"b", false}, {"[DONE]", true}},
		},
		{
			name:   "several events in one chunk",
			chunks: []string{"data: a\n\ndata: b\n\ndata: c\n\n"},
			want:   []event{{"a", false}, {"b", false}, {"c", false}},
		},
		{
			name:   "realistic OpenAI stream in one chunk",
			chunks: []string{openAIStream("\n")},
			want:   openAIEvents(),
		},
		{
			name:   "realistic OpenAI stream with CRLF",
			chunks: []string{openAIStream("\r\n")},
			want:   openAIEvents(),
		},
		{
			name:   "no space after colon",
			chunks: []string{"data:a\n\n"},
			want:   []event{{"a", false}},
		},
		{
			name:   "only one leading space is stripped",
			chunks: []string{"data:  a \n\n"},
			want:   []event{{" a ", false}},
		},
		{
			name:   "DONE without space",
			chunks: []string{"data:[DONE]\n\n"},
			want:   []event{{"[DONE]", true}},
		},
		{
			name:   "DONE lookalikes are not done",
			chunks: []string{"data: [DONE] \n\ndata: [done]\n\ndata: [DONE]x\n\n"},
			want:   []event{{"[DONE] ", false}, {"[done]", false}, {"[DONE]x", false}},
		},
		{
			name:   "comments ignored",
			chunks: []string{": keep-alive\n\n:\n\ndata: a\n: in the middle\n\n"},
			want:   []event{{"a", false}},
		},
		{
			name:   "CRLF line endings",
			chunks: []string{"data: a\r\n\r\ndata: [DONE]\r\n\r\n"},
			want:   []event{{"a", false}, {"[DONE]", true}},
		},
		{
			name:   "multi-line data joined with newline",
			chunks: []string{"data: first\ndata: second\ndata:\ndata: fourth\n\n"},
			want:   []event{{"first\nsecond\n\nfourth", false}},
		},
		{
			name:   "multi-line data with CRLF",
			chunks: []string{"data: first\r\ndata: second\r\n\r\n"},
			want:   []event{{"first\nsecond", false}},
		},
		{
			name:   "event id and retry lines ignored",
			chunks: []string{"event: message\nid: 7\nretry: 1000\ndata: a\n\nevent: ping\n\n"},
			want:   []event{{"a", false}},
		},
		{
			name:   "field names are case sensitive",
			chunks: []string{"Data: a\nDATA: b\ndata: c\n\n"},
			want:   []event{{"c", false}},
		},
		{
			name:   "data without colon is an empty data line",
			chunks: []string{"data\n\n"},
			want:   []event{{"", false}},
		},
		{
			name:   "blank lines without data dispatch nothing",
			chunks: []string{"\n\n\r\n\n"},
			want:   nil,
		},
		{
			name:   "flush dispatches pending event without final blank line",
			chunks: []string{"data: a\n\ndata: b\n"},
			want:   []event{{"a", false}, {"b", false}},
		},
		{
			name:   "flush dispatches pending event without any line ending",
			chunks: []string{"data: [DONE]"},
			want:   []event{{"[DONE]", true}},
		},
		{
			name:   "flush dispatches pending event ending in CR",
			chunks: []string{"data: a\r"},
			want:   []event{{"a", false}},
		},
		{
			name:   "empty chunks are harmless",
			chunks: []string{"", "data: a", "", "\n", "", "\n", ""},
			want:   []event{{"a", false}},
		},
		{
			name:   "CRLF split between CR and LF",
			chunks: []string{"data: a\r", "\n\r", "\n"},
			want:   []event{{"a", false}},
		},
		{
			name:   "one byte per chunk",
			chunks: strings.Split("data: a\n\n: ping\n\ndata: [DONE]\n\n", ""),
			want:   []event{{"a", false}, {"[DONE]", true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Parser
			got := feedAll(&p, tt.chunks...)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("events:\n got %v\nwant %v", got, tt.want)
			}
			if p.Dropped != 0 {
				t.Errorf("Dropped = %d, want 0", p.Dropped)
			}
		})
	}
}

// TestParserSplitAnywhere feeds each input in two chunks split at every
// byte offset; the events must not depend on where the split falls.
func TestParserSplitAnywhere(t *testing.T) {
	inputs := map[string]struct {
		in   string
		want []event
	}{
		"single event":       {"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", []event{{`{"choices":[{"delta":{"content":"hi"}}]}`, false}}},
		"openai stream LF":   {openAIStream("\n"), openAIEvents()},
		"openai stream CRLF": {openAIStream("\r\n"), openAIEvents()},
		"multi-line and comments": {
			": ping\r\nevent: x\ndata: a\ndata:b\r\n\r\ndata: [DONE]\n\n",
			[]event{{"a\nb", false}, {"[DONE]", true}},
		},
	}
	for name, tc := range inputs {
		t.Run(name, func(t *testing.T) {
			var whole Parser
			if got := feedAll(&whole, tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("whole input:\n got %v\nwant %v", got, tc.want)
			}
			for i := 0; i <= len(tc.in); i++ {
				var p Parser
				got := feedAll(&p, tc.in[:i], tc.in[i:])
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("split at %d (%q | %q):\n got %v\nwant %v", i, tc.in[:i], tc.in[i:], got, tc.want)
				}
			}
		})
	}
}

// TestParserReuse checks that one parser keeps working after Flush, as it
// would across the events of a stream, and that emitted Data is a fresh view
// each time rather than accumulating.
func TestParserReuse(t *testing.T) {
	var p Parser
	for i := range 3 {
		want := []event{{fmt.Sprintf("event %d", i), false}}
		if got := feedAll(&p, fmt.Sprintf("data: event %d\n", i)); !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: got %v, want %v", i, got, want)
		}
	}
}

func TestParserOverlongLine(t *testing.T) {
	long := "data: " + strings.Repeat("x", 64)
	tests := []struct {
		name        string
		chunks      []string
		want        []event
		wantDropped int
	}{
		{
			name:        "dropped across two chunks, next event kept",
			chunks:      []string{long[:40], long[40:] + "\n\ndata: ok\n\n"},
			want:        []event{{"ok", false}},
			wantDropped: 1,
		},
		{
			name:        "dropped when the tail keeps growing over many chunks",
			chunks:      []string{long[:10], long[10:20], long[20:30], long[30:], "yyyy", "\n\ndata: ok\n\n"},
			want:        []event{{"ok", false}},
			wantDropped: 1,
		},
		{
			name:        "line ending in the same chunk as the overflow is skipped",
			chunks:      []string{"data: before\n\n" + long[:20], long[20:] + "\ndata: ok\n\n"},
			want:        []event{{"before", false}, {"ok", false}},
			wantDropped: 1,
		},
		{
			name:        "overlong line within one chunk",
			chunks:      []string{long + "\n\ndata: ok\n\n"},
			want:        []event{{"ok", false}},
			wantDropped: 1,
		},
		{
			name:        "carried prefix within limit, line completed over it",
			chunks:      []string{long[:20], long[20:] + "\n\ndata: ok\n\n"},
			want:        []event{{"ok", false}},
			wantDropped: 1,
		},
		{
			name:        "data lines of the same event before the overlong line survive",
			chunks:      []string{"data: a\n" + long, "\ndata: b\n\n"},
			want:        []event{{"a\nb", false}},
			wantDropped: 1,
		},
		{
			name:        "two overlong lines counted separately",
			chunks:      []string{long, "\n", long, "\n\ndata: [DONE]\n\n"},
			want:        []event{{"[DONE]", true}},
			wantDropped: 2,
		},
		{
			name:        "overlong line pending at flush is not dispatched",
			chunks:      []string{"data: a\n\n" + long},
			want:        []event{{"a", false}},
			wantDropped: 1,
		},
		{
			name:        "a carried line exactly MaxLine long is kept",
			chunks:      []string{"data: " + strings.Repeat("y", 26), "\n\n"},
			want:        []event{{strings.Repeat("y", 26), false}},
			wantDropped: 0,
		},
		{
			name:        "a line exactly MaxLine long completed in the next chunk is kept",
			chunks:      []string{"data: " + strings.Repeat("y", 10), strings.Repeat("y", 16) + "\n\n"},
			want:        []event{{strings.Repeat("y", 26), false}},
			wantDropped: 0,
		},
		{
			name:        "a line exactly MaxLine long within one chunk is kept",
			chunks:      []string{"data: " + strings.Repeat("y", 26) + "\n\n"},
			want:        []event{{strings.Repeat("y", 26), false}},
			wantDropped: 0,
		},
		{
			name:        "one byte over MaxLine is dropped",
			chunks:      []string{"data: " + strings.Repeat("y", 27) + "\n\n"},
			want:        nil,
			wantDropped: 1,
		},
		{
			name:        "the CR of a CRLF counts toward the line",
			chunks:      []string{"data: " + strings.Repeat("y", 26) + "\r\n\r\n"},
			want:        nil,
			wantDropped: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Parser{MaxLine: 32}
			got := feedAll(&p, tt.chunks...)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("events:\n got %v\nwant %v", got, tt.want)
			}
			if p.Dropped != tt.wantDropped {
				t.Errorf("Dropped = %d, want %d", p.Dropped, tt.wantDropped)
			}
		})
	}
}

func TestParserEventOverflow(t *testing.T) {
	y := func(n int) string { return strings.Repeat("y", n) }
	tests := []struct {
		name           string
		chunks         []string
		want           []event
		wantOverflowed int
		wantDropped    int
	}{
		{
			name:   "multi-line data within MaxLine",
			chunks: []string{"data: " + y(10) + "\ndata: " + y(10) + "\n\n"},
			want:   []event{{y(10) + "\n" + y(10), false}},
		},
		{
			name:   "data exactly MaxLine long, newlines included, is kept",
			chunks: []string{"data: " + y(10) + "\ndata: " + y(10) + "\ndata: " + y(10) + "\n\n"},
			want:   []event{{y(10) + "\n" + y(10) + "\n" + y(10), false}},
		},
		{
			name:           "one byte over drops the whole event, the next is kept",
			chunks:         []string{"data: " + y(10) + "\ndata: " + y(10) + "\ndata: " + y(11) + "\n\ndata: ok\n\n"},
			want:           []event{{"ok", false}},
			wantOverflowed: 1,
		},
		{
			name:           "the joining newline counts",
			chunks:         []string{"data: " + y(16) + "\ndata: " + y(16) + "\n\ndata: ok\n\n"},
			want:           []event{{"ok", false}},
			wantOverflowed: 1,
		},
		{
			name:           "data lines after the overflow are ignored up to the blank line",
			chunks:         []string{"data: " + y(20) + "\ndata: " + y(20) + "\ndata: a\ndata: b\n: ping\nid: 1\n\ndata: ok\n\n"},
			want:           []event{{"ok", false}},
			wantOverflowed: 1,
		},
		{
			name:           "a CRLF blank line resynchronises too",
			chunks:         []string{"data: " + y(20) + "\r\ndata: " + y(20) + "\r\ndata: a\r\n\r\ndata: ok\r\n\r\n"},
			want:           []event{{"ok", false}},
			wantOverflowed: 1,
		},
		{
			name:           "split across chunks",
			chunks:         []string{"data: " + y(20) + "\ndata: ", y(10), y(10) + "\ndata: a\n", "\n", "data: ok\n\n"},
			want:           []event{{"ok", false}},
			wantOverflowed: 1,
		},
		{
			name:           "two overflowing events counted separately",
			chunks:         []string{"data: " + y(20) + "\ndata: " + y(20) + "\n\ndata: " + y(20) + "\ndata: " + y(20) + "\n\ndata: [DONE]\n\n"},
			want:           []event{{"[DONE]", true}},
			wantOverflowed: 2,
		},
		{
			name:           "an overlong line in an overflowed event is still an overlong line",
			chunks:         []string{"data: " + y(20) + "\ndata: " + y(20) + "\ndata: " + y(40) + "\n\ndata: ok\n\n"},
			want:           []event{{"ok", false}},
			wantOverflowed: 1,
			wantDropped:    1,
		},
		{
			name:           "an overflowed event pending at flush is not dispatched",
			chunks:         []string{"data: a\n\ndata: " + y(20) + "\ndata: " + y(20) + "\ndata: b"},
			want:           []event{{"a", false}},
			wantOverflowed: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Parser{MaxLine: 32}
			got := feedAll(&p, tt.chunks...)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("events:\n got %v\nwant %v", got, tt.want)
			}
			if p.Overflowed != tt.wantOverflowed || p.Dropped != tt.wantDropped {
				t.Errorf("Overflowed, Dropped = %d, %d; want %d, %d", p.Overflowed, p.Dropped, tt.wantOverflowed, tt.wantDropped)
			}
			// Flush ends the stream: the parser starts the next one clean.
			if got := feedAll(&p, "data: next\n\n"); !reflect.DeepEqual(got, []event{{"next", false}}) {
				t.Errorf("after Flush: got %v", got)
			}
		})
	}
}

// checkBounded fails if a buffer the parser holds could exceed its limit.
func checkBounded(t testing.TB, p *Parser) {
	t.Helper()
	limit := p.maxLine()
	if cap(p.carry) > limit || cap(p.data) > limit {
		t.Fatalf("MaxLine %d: parser holds carry %d (cap %d), data %d (cap %d)",
			p.MaxLine, len(p.carry), cap(p.carry), len(p.data), cap(p.data))
	}
}

// TestParserBoundedMemory: a pool that never ends a line, or never ends an
// event, cannot make the parser hold more than MaxLine per buffer, and a
// normal event after it is still delivered.
func TestParserBoundedMemory(t *testing.T) {
	noNewline := strings.Repeat("x", 10<<20)
	dataLines := func(n int) string { return strings.Repeat("data: x\n", n) }
	tests := []struct {
		name           string
		maxLine        int
		stream         string
		chunk          int // bytes per Feed
		wantDropped    int
		wantOverflowed int
	}{
		{"10 MiB without a newline, one chunk", 0, noNewline, len(noNewline), 1, 0},
		{"10 MiB without a newline, 16 KiB chunks", 0, noNewline, 16 << 10, 1, 0},
		{"10 MiB data line without a newline, 1000-byte chunks", 0, "data: " + noNewline, 1000, 1, 0},
		{"10 MiB without a newline, small MaxLine", 4096, noNewline, 16 << 10, 1, 0},
		{"100k data lines without a blank line", 0, dataLines(100_000), 16 << 10, 0, 0}, // 200 KB: under the cap
		{"100k data lines without a blank line, small MaxLine", 4096, dataLines(100_000), 16 << 10, 0, 1},
		{"600k data lines without a blank line", 0, dataLines(600_000), 64 << 10, 0, 1}, // 1.2 MB: over it
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Parser{MaxLine: tt.maxLine}
			var got []event
			emit := collect(&got)
			for s := tt.stream; len(s) > 0; {
				n := min(tt.chunk, len(s))
				p.Feed([]byte(s[:n]), emit)
				s = s[n:]
				checkBounded(t, &p)
			}
			p.Feed([]byte("\n\ndata: ok\n\n"), emit)
			checkBounded(t, &p)
			want := []event{{"ok", false}}
			if tt.wantDropped+tt.wantOverflowed == 0 { // the 100k lines were one event
				want = []event{{strings.TrimSuffix(strings.Repeat("x\n", 100_000), "\n"), false}, {"ok", false}}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %d events, want %d (the last %v)", len(got), len(want), want[len(want)-1])
			}
			if p.Dropped != tt.wantDropped || p.Overflowed != tt.wantOverflowed {
				t.Errorf("Dropped, Overflowed = %d, %d; want %d, %d", p.Dropped, p.Overflowed, tt.wantDropped, tt.wantOverflowed)
			}
		})
	}
}

// TestParserFloodAllocs: once it is discarding, the parser allocates
// nothing however much more the pool sends.
func TestParserFloodAllocs(t *testing.T) {
	flood := []byte(strings.Repeat("data: x\n", 8192))
	noNewline := []byte(strings.Repeat("x", 64<<10))
	p := Parser{MaxLine: 4096}
	p.Feed(flood, func(Event) { t.Fatal("event from an unfinished one") })
	if n := testing.AllocsPerRun(100, func() { p.Feed(flood, func(Event) {}) }); n != 0 {
		t.Errorf("Feed of data lines in an overflowed event: %.0f allocs", n)
	}
	p.Feed([]byte("\n\n"), func(Event) {})
	if n := testing.AllocsPerRun(100, func() { p.Feed(noNewline, func(Event) {}) }); n != 0 {
		t.Errorf("Feed of an overlong line: %.0f allocs", n)
	}
	checkBounded(t, &p)
}

// FuzzParser checks that the events, and the counts of dropped overlong
// lines and overflowed events, do not depend on how the stream is cut into
// chunks, that no buffer outgrows MaxLine and that no input panics. maxLine
// 0 means DefaultMaxLine; small values exercise the overlong-line and
// overflow paths.
func FuzzParser(f *testing.F) {
	f.Add([]byte(openAIStream("\n")), 100, uint16(0))
	f.Add([]byte(openAIStream("\r\n")), 7, uint16(0))
	f.Add([]byte(openAIStream("\n")), 250, uint16(200))
	f.Add([]byte("data: "+contentChunk+"\n\n"), 3, uint16(0))
	f.Add([]byte("data: "+usageChunk+"\r\n\r\ndata: [DONE]\r\n\r\n"), 200, uint16(0))
	f.Add([]byte(": keep-alive\n\nevent: ping\nid: 1\ndata: a\ndata: b\n\n"), 20, uint16(8))
	f.Add([]byte("data: a\r"), 8, uint16(0))
	f.Add([]byte("data: [DONE]"), 6, uint16(0))
	f.Add([]byte("\r\r\n\n\x00data\xff:\n:::\n\ndata"), 4, uint16(3))
	f.Add([]byte("garbage without newlines"), 10, uint16(5))
	f.Add([]byte{}, 0, uint16(0))
	// Events that never end, and what follows them.
	f.Add([]byte(strings.Repeat("data: x\n", 64)+"\ndata: ok\n\n"), 100, uint16(32))
	f.Add([]byte(strings.Repeat("data: x\r\n", 64)+": ping\r\n\r\ndata: [DONE]\r\n\r\n"), 7, uint16(50))
	f.Add([]byte("data: "+strings.Repeat("y", 40)+"\ndata: "+strings.Repeat("y", 40)+"\ndata: a\n\ndata: b\n\n"), 45, uint16(64))
	f.Add([]byte(strings.Repeat("data: x\n", 300)), 1000, uint16(0))
	f.Add([]byte(strings.Repeat("x", 5000)+"\n\ndata: ok\n\n"), 2500, uint16(1024))
	f.Fuzz(func(t *testing.T, in []byte, split int, maxLine uint16) {
		split = int(uint(split) % uint(len(in)+1))

		whole := Parser{MaxLine: int(maxLine)}
		want := feedAll(&whole, string(in))
		p := Parser{MaxLine: int(maxLine)}
		var got []event
		emit := collect(&got)
		p.Feed(in[:split], emit)
		checkBounded(t, &p)
		p.Feed(in[split:], emit)
		checkBounded(t, &p)
		p.Flush(emit)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("MaxLine %d, split at %d of %q:\n got %v\nwant %v", maxLine, split, in, got, want)
		}
		if p.Dropped != whole.Dropped || p.Overflowed != whole.Overflowed {
			t.Fatalf("MaxLine %d, split at %d of %q: Dropped, Overflowed = %d, %d; whole = %d, %d",
				maxLine, split, in, p.Dropped, p.Overflowed, whole.Dropped, whole.Overflowed)
		}
		for _, e := range want {
			if e.Done != (e.Data == "[DONE]") {
				t.Fatalf("event %q has Done=%v", e.Data, e.Done)
			}
			if len(e.Data) > p.maxLine() {
				t.Fatalf("MaxLine %d: event of %d bytes delivered", maxLine, len(e.Data))
			}
		}
		if maxLine == 0 && len(in) <= DefaultMaxLine && whole.Dropped+whole.Overflowed != 0 {
			t.Fatalf("Dropped, Overflowed = %d, %d for input shorter than DefaultMaxLine", whole.Dropped, whole.Overflowed)
		}
	})
}

// benchEvent is what Envoy typically hands the meter for each token: one
// whole chat.completion.chunk event.
var benchEvent = []byte("data: " + contentChunk + "\n\n")

func BenchmarkParserChunkPerEvent(b *testing.B) {
	var p Parser
	n := 0
	emit := func(e Event) { n += len(e.Data) }
	b.ReportAllocs()
	b.SetBytes(int64(len(benchEvent)))
	for b.Loop() {
		p.Feed(benchEvent, emit)
	}
	if n == 0 {
		b.Fatal("no events")
	}
}

func BenchmarkParserSplitEvents(b *testing.B) {
	var p Parser
	n := 0
	emit := func(e Event) { n += len(e.Data) }
	// Each chunk ends in the middle of an event, so every event is
	// reassembled from the carry-over buffer.
	mid := len(benchEvent) / 2
	first, second := benchEvent[:mid], benchEvent[mid:]
	b.ReportAllocs()
	b.SetBytes(int64(len(benchEvent)))
	for b.Loop() {
		p.Feed(first, emit)
		p.Feed(second, emit)
	}
	if n == 0 {
		b.Fatal("no events")
	}
	if len(p.carry) != 0 {
		b.Fatalf("carry not empty after whole events: %q", p.carry)
	}
}

// Named events (the Responses and Anthropic APIs) carry their name with
// their data, however the stream is split; a name belongs to its own
// event only, and an event without data dispatches nothing, its name
// included.
func TestParserEventNames(t *testing.T) {
	in := "event: message_start\ndata: {\"a\":1}\n\nevent: ping\n\ndata: {\"b\":2}\n\nevent:response.output_text.delta\r\ndata: x\r\n\r\n"
	want := []string{"message_start {\"a\":1}", " {\"b\":2}", "response.output_text.delta x"}
	for split := range len(in) + 1 {
		var p Parser
		var got []string
		emit := func(e Event) { got = append(got, string(e.Name)+" "+string(e.Data)) }
		p.Feed([]byte(in[:split]), emit)
		p.Feed([]byte(in[split:]), emit)
		p.Flush(emit)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("split at %d: %q, want %q", split, got, want)
		}
	}
}
