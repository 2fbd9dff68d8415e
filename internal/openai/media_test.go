package openai

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"strings"
	"testing"
)

// OpenAI's documented examples of its tile formula, and its extremes.
func TestImageTokens(t *testing.T) {
	for _, tc := range []struct {
		detail string
		w, h   int
		want   int
	}{
		{"high", 1024, 1024, 765},  // 768 × 768: 4 tiles
		{"high", 2048, 4096, 1105}, // 1024 × 2048, then 768 × 1536: 6 tiles
		{"auto", 2048, 4096, 1105}, // auto may pick high
		{"", 2048, 4096, 1105},
		{"low", 2048, 4096, 85},
		{"high", 1, 1, 255},       // one tile
		{"high", 512, 512, 255},   // still one
		{"high", 513, 512, 425},   // two
		{"high", 2048, 768, 1445}, // 4 × 2: the most any size makes
		{"high", 1 << 30, 1, 765}, // 2048 × 1 (scaled to fit, not up): 4 tiles
		{"high", 1 << 30, 1 << 30, 765},
		{"high", 0, 0, 1445}, // size unknown: the most
		{"high", -5, 10, 1445},
	} {
		if got := ImageTokens(tc.detail, tc.w, tc.h); got != tc.want {
			t.Errorf("ImageTokens(%q, %d, %d) = %d, want %d", tc.detail, tc.w, tc.h, got, tc.want)
		}
	}
}

func encoded(t *testing.T, encode func(*bytes.Buffer, image.Image) error, w, h int) string {
	t.Helper()
	var b bytes.Buffer
	if err := encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b.Bytes())
}

func pngOf(t *testing.T, w, h int) string {
	return encoded(t, func(b *bytes.Buffer, m image.Image) error { return png.Encode(b, m) }, w, h)
}

func jpegOf(t *testing.T, w, h int) string {
	return encoded(t, func(b *bytes.Buffer, m image.Image) error { return jpeg.Encode(b, m, nil) }, w, h)
}

// A real image's size is read from the first bytes of its base64 data:
// PNG, JPEG (its size may follow metadata), GIF and WebP.
func TestImageSize(t *testing.T) {
	j := jpegOf(t, 300, 200)
	raw, _ := base64.StdEncoding.DecodeString(j)
	exif := append([]byte{0xff, 0xd8, 0xff, 0xe1, 0x10, 0x02}, make([]byte, 0x1000)...) // SOI, an APP1 of 4 KiB
	withExif := base64.StdEncoding.EncodeToString(append(exif, raw[2:]...))
	var g bytes.Buffer
	if err := gif.Encode(&g, image.NewPaletted(image.Rect(0, 0, 640, 10), color.Palette{color.Black, color.White}), nil); err != nil {
		t.Fatal(err)
	}
	// VP8X: 24-bit width-1 and height-1 at bytes 24 and 27.
	vp8x := append([]byte("RIFF\x00\x00\x00\x00WEBPVP8X"), make([]byte, 8)...)
	vp8x = append(vp8x, 0xff, 0x0f, 0x00, 0x7f, 0x00, 0x00) // 4096 × 128
	// VP8L: 14-bit width-1 and height-1 packed from byte 21.
	vp8l := append([]byte("RIFF\x00\x00\x00\x00WEBPVP8L\x00\x00\x00\x00\x2f"), 99, 0x40, 0x1f, 0, 0, 0, 0, 0, 0) // 100 × 126
	for _, tc := range []struct {
		name, b64 string
		w, h      int
	}{
		{"png", pngOf(t, 1024, 768), 1024, 768},
		{"png, tall", pngOf(t, 1, 5000), 1, 5000},
		{"jpeg", j, 300, 200},
		{"jpeg after 4 KiB of metadata", withExif, 300, 200},
		{"gif", base64.StdEncoding.EncodeToString(g.Bytes()), 640, 10},
		{"webp, extended", base64.StdEncoding.EncodeToString(vp8x), 4096, 128},
		{"webp, lossless", base64.StdEncoding.EncodeToString(vp8l), 100, 126},
		{"url-safe base64", strings.NewReplacer("+", "-", "/", "_").Replace(pngOf(t, 70, 80)), 70, 80},
		{"not an image", "AAAA", 0, 0},
		{"truncated png", pngOf(t, 10, 10)[:12], 0, 0},
		{"not base64", "!!!!", 0, 0},
		{"empty", "", 0, 0},
	} {
		if w, h := imageSize(tc.b64); w != tc.w || h != tc.h {
			t.Errorf("%s: imageSize = %d × %d, want %d × %d", tc.name, w, h, tc.w, tc.h)
		}
	}
}

// Media parts are estimated from what the request says of them.
func TestMediaEstimate(t *testing.T) {
	chat := func(parts string) string {
		return `{"model":"m","messages":[{"role":"user","content":[` + parts + `]}]}`
	}
	base := func(parts string) int {
		r, err := ParseRequest([]byte(chat(parts)))
		if err != nil {
			t.Fatal(err)
		}
		return r.PromptTokens - (TokensPerMessage + TokensPerRequest)
	}
	big := pngOf(t, 2048, 4096)
	for _, tc := range []struct {
		name, part string
		want       int
	}{
		{"inline png, high", `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + big + `","detail":"high"}}`, 1105},
		{"inline png, auto", `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + big + `"}}`, 1105},
		{"inline png, low", `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + big + `","detail":"low"}}`, 85},
		{"inline jpeg, 1 tile", `{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,` + jpegOf(t, 300, 200) + `"}}`, 255},
		{"by url, high: any size", `{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"high"}}`, 1445},
		{"by url, low", `{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"low"}}`, 85},
		{"vLLM's string form", `{"type":"image_url","image_url":"https://x/a.png"}`, 1445},
		{"Responses' input_image", `{"type":"input_image","image_url":"data:image/png;base64,` + pngOf(t, 1024, 1024) + `","detail":"auto"}`, 765},
		{"audio: a token per 64 bytes", `{"type":"input_audio","input_audio":{"data":"` + base64.StdEncoding.EncodeToString(make([]byte, 6400)) + `","format":"wav"}}`, 100},
		{"audio without data", `{"type":"input_audio","input_audio":{}}`, TokensPerImage},
		{"a file", `{"type":"file","file":{"file_id":"f"}}`, TokensPerImage},
	} {
		if got := base(tc.part); got != tc.want {
			t.Errorf("%s: estimated %d, want %d", tc.name, got, tc.want)
		}
	}
	// Anthropic's image blocks: inline by size, by URL at any size.
	msg := func(block string) int {
		r, err := ParseMessages([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[` + block + `]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return r.PromptTokens - (TokensPerMessage + TokensPerRequest)
	}
	if got := msg(`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + pngOf(t, 1024, 1024) + `"}}`); got != 765 {
		t.Errorf("Anthropic inline png: %d, want 765", got)
	}
	if got := msg(`{"type":"image","source":{"type":"url","url":"https://x/a.png"}}`); got != 1445 {
		t.Errorf("Anthropic image by URL: %d, want 1445", got)
	}
}

// MaxPromptTokens: what a body can hold, or 0 when it refers to input the
// gate cannot see.
func TestMaxPromptTokens(t *testing.T) {
	img := `{"type":"image_url","image_url":{"url":"https://x/a.png"}}`
	for _, tc := range []struct {
		name string
		api  API
		body string
		// extra is what the bound adds to the body's size and
		// MaxHiddenPromptTokens; -1: no bound.
		extra int
	}{
		{"text", APIChat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 0},
		{"two images", APIChat, `{"model":"m","messages":[{"role":"user","content":[` + img + `,` + img + `]}]}`, 2 * MaxTokensPerImage},
		{"a function tool: its JSON again", APIChat, `{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}`,
			len(`[{"type":"function","function":{"name":"f"}}]`)},
		{"a tool call's function again", APIChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
			len("f") + len("{}")},
		{"a completion's token IDs", APICompletions, `{"model":"m","prompt":[1,2,3]}`, 0},
		{"embeddings", APIEmbeddings, `{"model":"m","input":["a","b"]}`, 0},
		{"a file", APIChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}]}`, -1},
		{"a video", APIChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"video_url","video_url":{"url":"https://x/v.mp4"}}]}]}`, -1},
		{"web search", APIChat, `{"model":"m","messages":[],"web_search_options":{}}`, -1},
		{"a server tool", APIResponses, `{"model":"m","input":"hi","tools":[{"type":"web_search"}]}`, -1},
		{"a Responses function tool", APIResponses, `{"model":"m","input":"hi","tools":[{"type":"function","name":"f"}]}`,
			len(`[{"type":"function","name":"f"}]`)},
		{"a stored response", APIResponses, `{"model":"m","input":"hi","previous_response_id":"r"}`, -1},
		{"an item reference", APIResponses, `{"model":"m","input":[{"type":"item_reference","id":"i"}]}`, -1},
		{"encrypted reasoning", APIResponses, `{"model":"m","input":[{"type":"reasoning","encrypted_content":"xyz"}]}`, -1},
		{"Anthropic: a client tool", APIMessages, `{"model":"m","max_tokens":1,"messages":[],"tools":[{"name":"f","input_schema":{}}]}`,
			len(`[{"name":"f","input_schema":{}}]`)},
		{"Anthropic: a server tool", APIMessages, `{"model":"m","max_tokens":1,"messages":[],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, -1},
		{"Anthropic: MCP servers", APIMessages, `{"model":"m","max_tokens":1,"messages":[],"mcp_servers":[]}`, -1},
		{"Anthropic: a document", APIMessages, `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"url","url":"https://x/a.pdf"}}]}]}`, -1},
	} {
		r, err := Parse(tc.api, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := 0
		if tc.extra >= 0 {
			want = len(tc.body) + MaxHiddenPromptTokens + tc.extra
		}
		if r.MaxPromptTokens != want {
			t.Errorf("%s: MaxPromptTokens = %d, want %d", tc.name, r.MaxPromptTokens, want)
		}
	}
}
