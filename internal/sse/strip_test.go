package sse

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// A chat stream as a pool sends it when include_usage was asked for, and
// as the client must see it when it was not.
const (
	chatContent = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"
	chatUsage = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n"
	chatDone  = "data: [DONE]\n\n"
)

// stripAll runs chunks through a fresh stripper and returns what it forwards.
func stripAll(t testing.TB, chunks ...[]byte) []byte {
	var s UsageStripper
	var got []byte
	for _, c := range chunks {
		out, changed := s.Strip(c)
		if !changed && !bytes.Equal(out, c) {
			t.Fatalf("Strip(%q) = %q, unchanged", c, out)
		}
		got = append(got, out...)
	}
	return append(got, s.End()...)
}

// reference strips the whole stream at once: a usage line that starts an
// event is removed with the blank line after it, or when the stream ends
// after it (a "\r" at most: perhaps a blank line cut short).
func reference(in []byte) []byte {
	var out []byte
	mid := false
	for len(in) > 0 {
		i := bytes.IndexByte(in, '\n')
		if i < 0 {
			return append(out, in...)
		}
		line, rest := in[:i+1], in[i+1:]
		if !mid && isUsageLine(line) {
			j := bytes.IndexByte(rest, '\n')
			if j < 0 && (len(rest) == 0 || string(rest) == "\r") {
				return append(out, rest...)
			}
			if j < 0 {
				return append(append(out, line...), rest...)
			}
			if isBlank(rest[:j+1]) {
				in = rest[j+1:]
				continue
			}
		}
		out = append(out, line...)
		mid = !isBlank(line)
		in = rest
	}
	return out
}

func TestUsageStripperChat(t *testing.T) {
	in := chatContent + chatUsage + chatDone
	want := chatContent + chatDone
	if got := stripAll(t, []byte(in)); string(got) != want {
		t.Fatalf("whole:\n got %q\nwant %q", got, want)
	}
	for i := range len(in) + 1 { // every split in two
		if got := stripAll(t, []byte(in[:i]), []byte(in[i:])); string(got) != want {
			t.Fatalf("split at %d:\n got %q\nwant %q", i, got, want)
		}
	}
	var one [][]byte // byte by byte
	for i := range len(in) {
		one = append(one, []byte(in[i:i+1]))
	}
	if got := stripAll(t, one...); string(got) != want {
		t.Fatalf("byte by byte:\n got %q\nwant %q", got, want)
	}
}

func TestUsageStripperKeeps(t *testing.T) {
	for name, in := range map[string]string{
		"no usage event":      chatContent + chatDone,
		"usage null":          "data: {\"choices\":[],\"usage\":null}\n\n",
		"running usage":       "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\":{\"completion_tokens\":1}}\n\n",
		"usage in content":    "data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":{} \\\"choices\\\":[]\"}}]}\n\n",
		"second data line":    chatUsage[:len(chatUsage)-1] + "data: {}\n\n",
		"after an id line":    "id: 1\n" + chatUsage,
		"comment before":      ": hi\n" + chatUsage, // a comment line continues the event's lines
		"nested usage":        "data: {\"x\":{\"choices\":[],\"usage\":{}}}\n\n",
		"not json":            "data: {\"choices\":[],\"usage\":{}\n\n",
		"event field":         "event: x\n" + chatUsage,
		"responses complete":  "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":1}}}\n\n",
		"no trailing newline": chatContent + "data: [DONE]",
		"bare CR":             strings.ReplaceAll(chatUsage, "\n", "\r"),
	} {
		t.Run(name, func(t *testing.T) {
			if got := stripAll(t, []byte(in)); string(got) != in {
				t.Fatalf("got %q\nwant %q", got, in)
			}
		})
	}
}

func TestUsageStripperStrips(t *testing.T) {
	crlf := strings.ReplaceAll(chatUsage, "\n", "\r\n")
	for name, tc := range map[string]struct{ in, want string }{
		"completions": {
			"data: {\"id\":\"t\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"hi\",\"index\":0}]}\n\n" +
				"data: {\"id\":\"t\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,\"total_tokens\":2}}\n\n" + chatDone,
			"data: {\"id\":\"t\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"hi\",\"index\":0}]}\n\n" + chatDone,
		},
		"spaces":           {"data:{ \"choices\" : [ ] , \"usage\" : { } }\n\n" + chatDone, chatDone},
		"crlf":             {crlf + chatDone, chatDone},
		"first event":      {chatUsage, ""},
		"unterminated":     {chatContent + chatUsage[:len(chatUsage)-1], chatContent},
		"after keep-alive": {chatContent + ": ping\n\n" + chatUsage + chatDone, chatContent + ": ping\n\n" + chatDone},
	} {
		t.Run(name, func(t *testing.T) {
			if got := stripAll(t, []byte(tc.in)); string(got) != tc.want {
				t.Fatalf("got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestUsageStripperPassesPromptly: after each chunk, what it has not
// forwarded is at most a usage line and the incomplete line after it, or
// the incomplete trailing line alone, no longer than MaxUsageEvent unless
// it began as neither.
func TestUsageStripperPassesPromptly(t *testing.T) {
	in := []byte(chatContent + chatUsage + chatDone)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		var s UsageStripper
		var fed, sent int // input fed; reference output length sent
		want := reference(in)
		var got []byte
		for fed < len(in) {
			n := min(len(in)-fed, 1+rng.IntN(40))
			out, _ := s.Strip(in[fed : fed+n])
			fed += n
			got = append(got, out...)
			sent = len(got)
			if !bytes.HasPrefix(want, got) {
				t.Fatalf("forwarded %q, not a prefix of %q", got, want)
			}
			pending := in[:fed]
			// What the input so far strips to, minus what was forwarded,
			// must be only the held tail.
			if r := reference(pending); len(r) > sent && bytes.Contains(r[sent:], []byte("\n")) && !bytes.HasPrefix(r[sent:], []byte(chatUsage[:len(chatUsage)-1])) {
				t.Fatalf("after %d bytes held back complete lines: %q", fed, r[sent:])
			}
		}
		if got = append(got, s.End()...); !bytes.Equal(got, want) {
			t.Fatalf("got %q\nwant %q", got, want)
		}
	}
}

func TestUsageStripperUnchangedIsChunk(t *testing.T) {
	var s UsageStripper
	c := []byte(chatContent)
	if out, changed := s.Strip(c); changed || &out[0] != &c[0] {
		t.Fatalf("a plain chunk was copied (changed=%t)", changed)
	}
	if got := testing.AllocsPerRun(100, func() { s.Strip(c) }); got != 0 {
		t.Fatalf("a plain chunk allocated %v times", got)
	}
}

func TestUsageStripperLongLinePasses(t *testing.T) {
	var s UsageStripper
	long := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", MaxUsageEvent) + "\"}}]}\n\n"
	out, _ := s.Strip([]byte(long[:MaxUsageEvent+10]))
	if len(out) != MaxUsageEvent+10 {
		t.Fatalf("held %d bytes of a line too long to be the usage event", MaxUsageEvent+10-len(out))
	}
}

func FuzzUsageStripper(f *testing.F) {
	f.Add([]byte(chatContent+chatUsage+chatDone), uint64(7))
	f.Add([]byte(strings.ReplaceAll(chatContent+chatUsage+chatDone, "\n", "\r\n")), uint64(3))
	f.Add([]byte("id: 1\n"+chatUsage+"\r\n"+chatUsage+"x"), uint64(1))
	f.Add([]byte(chatUsage[:len(chatUsage)-1]+"\r"), uint64(2))
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		want := reference(in)
		rng := rand.New(rand.NewPCG(seed, seed>>1))
		var chunks [][]byte
		for rest := in; len(rest) > 0; {
			n := min(len(rest), rng.IntN(len(in)+1)+1)
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		if got := stripAll(t, chunks...); !bytes.Equal(got, want) {
			t.Fatalf("chunks %q:\n got %q\nwant %q", chunks, got, want)
		}
	})
}

func BenchmarkUsageStripperChunk(b *testing.B) {
	c := []byte(chatContent)
	var s UsageStripper
	b.SetBytes(int64(len(c)))
	for b.Loop() {
		s.Strip(c)
	}
}
