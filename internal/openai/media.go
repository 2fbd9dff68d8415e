package openai

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"math"
	"strings"

	"github.com/tidwall/gjson"
)

// Media parts are estimated from what the request says of them: an
// image by its detail and, sent inline, its size (read from the first
// bytes of its data) at OpenAI's documented tile cost; audio by the size
// of its data; a file by the size of its data, as text. What the gate
// cannot see (a file, video or audio by reference) is estimated at
// TokensPerImage and leaves the body's input unbounded (MaxPromptTokens
// 0). Each estimate errs high where servers differ; usage above it is
// charged on the pool's proof and carried over as debt (internal/ratelimit).
const (
	// TokensPerImage is OpenAI's cost of a low-detail image (its base
	// tile), and the estimate of a part the gate cannot see into.
	TokensPerImage = 85
	// TokensPerTile is OpenAI's cost of each 512-pixel tile of a
	// high-detail image, beyond TokensPerImage.
	TokensPerTile = 170
	// maxTiles is the most tiles an image can make: scaled to fit 2048 ×
	// 2048, then its shortest side to 768, it spans at most 4 × 2 tiles.
	maxTiles = 8
	// MaxTokensPerImage bounds what any server counts for one image: the
	// largest known, gpt-4o-mini's high detail (2,833 + 5,667 a tile, 8
	// tiles: 48,169), rounded up to a power of two (open vision models
	// count up to 16,384 at their default resolutions).
	MaxTokensPerImage = 1 << 16
	// audioBytesPerToken is the audio data estimated per token: at 32
	// tokens a second (Gemini's rate, the highest known; OpenAI's is
	// lower), every stream of 16 kbit/s or more spends at most one token
	// per 64 bytes (uncompressed 16 kHz speech spends one per 1,000).
	audioBytesPerToken = 64
	// maxImageHeader bounds the bytes read of an inline image to find its
	// size (a JPEG's may follow its metadata).
	maxImageHeader = 64 << 10
	// MaxHiddenPromptTokens is what a server may add to a prompt beyond
	// the body's bytes: a default system prompt, a tool-use preamble
	// (Anthropic's 346 tokens; Hermes, Llama 3.1 and gpt-oss templates'
	// a few hundred), the chat template's markup.
	MaxHiddenPromptTokens = 1 << 12
)

// media counts a content part that is not text, of type typ: an image
// (chat's image_url, Responses' input_image, Anthropic's image), audio
// sent inline (input_audio), or anything else (a file, a document, a
// video, audio by URL), which the gate cannot see.
func (e *estimate) media(typ string, p gjson.Result) {
	switch typ {
	case "image_url", "input_image":
		url := p.Get("image_url")
		detail := p.Get("detail")
		if url.IsObject() { // chat: {"url": ..., "detail": ...}
			url, detail = url.Get("url"), url.Get("detail")
		}
		e.image(detail.Str, dataURL(url.Str))
	case "image":
		e.anthropicSource(p.Get("source"))
	case "input_audio":
		data := p.Get("input_audio.data")
		if data.Type != gjson.String {
			e.unseen(TokensPerImage)
			return
		}
		b64 := data.Raw[1 : len(data.Raw)-1]
		n := len(b64)*3/4 - (len(b64) - len(strings.TrimRight(b64, "=")))
		e.tokens += (max(n, 0) + audioBytesPerToken - 1) / audioBytesPerToken
	default:
		e.unseen(TokensPerImage)
	}
}

// anthropicSource counts an Anthropic image or document by its source:
// an image sent inline by its size, by URL or file at the most an image
// costs; anything else (a document) as unseen.
func (e *estimate) anthropicSource(src gjson.Result) {
	switch mt := src.Get("media_type").Str; {
	case src.Get("type").Str == "base64" && strings.HasPrefix(mt, "image/"):
		e.image("", src.Get("data").Str)
	case src.Get("type").Str == "url" || src.Get("type").Str == "file":
		e.image("", "")
	default:
		e.unseen(TokensPerImage)
	}
}

// unseen counts a part whose content the gate cannot see: n tokens as
// its estimate, and the body no longer bounds the input.
func (e *estimate) unseen(n int) {
	e.tokens += n
	e.blind = true
}

// image counts an image at detail ("low", "high", "auto" or ""), whose
// base64 data (inline) is b64, "" when sent by reference.
func (e *estimate) image(detail, b64 string) {
	w, h := 0, 0
	if b64 != "" {
		w, h = imageSize(b64)
	}
	e.tokens += ImageTokens(detail, w, h)
	e.mediaMax += MaxTokensPerImage
}

// ImageTokens is OpenAI's documented cost of an image of w × h pixels at
// detail: TokensPerImage at "low"; else (high, and auto, which may pick
// high) TokensPerImage plus TokensPerTile for each 512-pixel tile of the
// image scaled to fit 2048 × 2048, then its shortest side to 768. An
// image of unknown size (w or h 0) costs the most any size can.
func ImageTokens(detail string, w, h int) int {
	switch {
	case detail == "low":
		return TokensPerImage
	case w <= 0 || h <= 0:
		return TokensPerImage + maxTiles*TokensPerTile
	}
	fw, fh := float64(w), float64(h)
	if s := 2048 / max(fw, fh); s < 1 {
		fw, fh = fw*s, fh*s
	}
	if s := 768 / min(fw, fh); s < 1 {
		fw, fh = fw*s, fh*s
	}
	tiles := max(1, int(math.Ceil(fw/512))) * max(1, int(math.Ceil(fh/512)))
	return TokensPerImage + min(tiles, maxTiles)*TokensPerTile
}

// dataURL is the base64 data of a data: URL ("data:image/png;base64,...");
// "" for any other URL.
func dataURL(url string) string {
	meta, data, ok := strings.Cut(url, ",")
	if !ok || !strings.HasPrefix(meta, "data:") || !strings.HasSuffix(meta, ";base64") {
		return ""
	}
	return data
}

// imageSize reads the width and height of a PNG, JPEG, GIF or WebP image
// from the first bytes of its base64 data; 0, 0 when they cannot be read.
func imageSize(b64 string) (w, h int) {
	enc := base64.StdEncoding
	if strings.ContainsAny(b64[:min(len(b64), 64)], "-_") {
		enc = base64.URLEncoding
	}
	r := io.LimitReader(base64.NewDecoder(enc, strings.NewReader(b64)), maxImageHeader)
	var head [30]byte
	n, _ := io.ReadFull(r, head[:])
	b := head[:n]
	if w, h, ok := webpSize(b); ok {
		return w, h
	}
	var decode func(io.Reader) (image.Config, error)
	switch {
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		decode = png.DecodeConfig
	case bytes.HasPrefix(b, []byte("\xff\xd8")):
		decode = jpeg.DecodeConfig
	case bytes.HasPrefix(b, []byte("GIF8")):
		decode = gif.DecodeConfig
	default:
		return 0, 0
	}
	c, err := decode(io.MultiReader(bytes.NewReader(b), r))
	if err != nil {
		return 0, 0
	}
	return c.Width, c.Height
}

// webpSize reads a WebP image's size from its first 30 bytes: a lossy
// (VP8), lossless (VP8L) or extended (VP8X) header.
func webpSize(b []byte) (w, h int, ok bool) {
	if len(b) < 30 || string(b[0:4]) != "RIFF" || string(b[8:12]) != "WEBP" {
		return 0, 0, false
	}
	switch string(b[12:16]) {
	case "VP8 ":
		return int(binary.LittleEndian.Uint16(b[26:]) & 0x3fff), int(binary.LittleEndian.Uint16(b[28:]) & 0x3fff), true
	case "VP8L":
		bits := binary.LittleEndian.Uint32(b[21:])
		return int(bits&0x3fff) + 1, int(bits>>14&0x3fff) + 1, true
	case "VP8X":
		return int(uint32(b[24])|uint32(b[25])<<8|uint32(b[26])<<16) + 1, int(uint32(b[27])|uint32(b[28])<<8|uint32(b[29])<<16) + 1, true
	}
	return 0, 0, false
}
