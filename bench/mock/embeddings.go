package mock

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"
	"strconv"
	"time"
)

// The OpenAI embeddings API (POST /v1/embeddings). An embedding request is
// a prefill alone: admitted like any request, it answers at
// TTFT + TTFTPerPromptToken·uncached prompt tokens after admission, with
// one unit vector per input. A vector is a pure function of the model, the
// input's tokens and the dimensions, so equal inputs embed equally.

const (
	defaultEmbeddingDimensions = 256
	maxEmbeddingDimensions     = 1 << 16
)

type embeddingList struct {
	Object string          `json:"object"`
	Data   []embeddingItem `json:"data"`
	Model  string          `json:"model"`
	Usage  embeddingUsage  `json:"usage"`
}

type embeddingItem struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string of little-endian float32s
}

type embeddingUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// embed answers an embeddings request once its prefill is over.
func (s *Server) embed(ctx context.Context, w http.ResponseWriter, c *completion, t *ticket) int {
	if err := s.prefill(ctx, c, t); err != nil {
		s.clientGone(c, 0, err)
		return statusClientClosed
	}
	timer := time.NewTimer(math.MaxInt64)
	defer timer.Stop()
	if err := sleepUntil(ctx, timer, c.sched.jittered(0, c.sched.first)); err != nil {
		s.clientGone(c, 0, err)
		return statusClientClosed
	}
	return writeJSON(w, http.StatusOK, c.embeddings())
}

func (c *completion) embeddings() embeddingList {
	l := embeddingList{
		Object: "list", Data: make([]embeddingItem, len(c.embedInputs)), Model: c.model,
		Usage: embeddingUsage{PromptTokens: c.promptTokens, TotalTokens: c.promptTokens},
	}
	for i, in := range c.embedInputs {
		v := c.vector(in)
		l.Data[i] = embeddingItem{Object: "embedding", Index: i, Embedding: v}
		if c.base64 {
			b := make([]byte, 0, 4*len(v))
			for _, f := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
			}
			l.Data[i].Embedding = base64.StdEncoding.EncodeToString(b)
		}
	}
	return l
}

// vector is the unit vector of one input's tokens.
func (c *completion) vector(tokens []string) []float32 {
	h := sha256.New()
	h.Write([]byte(c.model))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(c.dimensions)))
	for _, t := range tokens {
		h.Write([]byte{0})
		h.Write([]byte(t))
	}
	rng := splitMix64{state: binary.BigEndian.Uint64(h.Sum(nil))}
	v := make([]float64, c.dimensions)
	norm := 0.0
	for i := range v {
		v[i] = float64(rng.next()>>11)/(1<<52) - 1 // uniform in [-1, 1)
		// The explicit conversion forbids a fused multiply-add, which
		// some architectures would round differently.
		norm += float64(v[i] * v[i])
	}
	norm = math.Sqrt(norm)
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x / norm)
	}
	return out
}
