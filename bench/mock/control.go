package mock

import (
	"encoding/json"
	"math"
	"net/http"
	"time"
)

// Faults make completion requests misbehave. ErrorRate fails a share of
// requests, spread evenly (not at random) so that a test sees exactly the
// rate it set. The mid-stream faults hit every request that reaches their
// token position; token positions count output tokens from 1, and 0 turns a
// fault off.
type Faults struct {
	ErrorRate   float64 // 0..1
	ErrorStatus int     // e.g. 503 or 429; default 503

	// RetryAfter is the Retry-After of injected errors and of queue-full
	// refusals, rounded up to whole seconds. A 429 always carries one
	// (1s when zero); other statuses only when it is set.
	RetryAfter time.Duration

	StallAfter     int           // pause for Stall once this many tokens are out; later tokens shift by Stall
	Stall          time.Duration // length of that pause
	ResetAfter     int           // abort the connection once this many tokens are out: the client sees a truncated response
	MalformedAfter int           // once this many tokens are out, send one event whose JSON is cut in half, then carry on
}

// streamFaults are the mid-stream faults in force for one request.
type streamFaults struct {
	stallAfter     int
	stall          time.Duration
	resetAfter     int
	malformedAfter int
}

// SetConfig replaces the cadence and capacity model for requests that start
// from now on; a changed batch limit also applies to requests waiting now.
func (s *Server) SetConfig(cfg Config) {
	c := cfg.normalized()
	s.cfg.Store(&c)
	s.engine.configure(c.MaxBatch, c.MaxQueue, c.PrefixCacheTokens)
}

// Config is the cadence in force.
func (s *Server) Config() Config { return *s.cfg.Load() }

// SetFaults replaces the fault injection for requests that start from now on.
func (s *Server) SetFaults(f Faults) {
	if f.ErrorStatus == 0 {
		f.ErrorStatus = http.StatusServiceUnavailable
	}
	f.ErrorRate = min(max(f.ErrorRate, 0), 1)
	f.RetryAfter = max(f.RetryAfter, 0)
	f.StallAfter = max(f.StallAfter, 0)
	f.Stall = max(f.Stall, 0)
	f.ResetAfter = max(f.ResetAfter, 0)
	f.MalformedAfter = max(f.MalformedAfter, 0)
	s.faults.Store(&f)
}

// Faults is the fault injection in force.
func (s *Server) Faults() Faults { return *s.faults.Load() }

// injectFault returns the status to fail this request with, or 0.
func (s *Server) injectFault() int {
	f := s.faults.Load()
	if f.ErrorRate <= 0 {
		return 0
	}
	n := float64(s.faultN.Add(1))
	// The n-th request fails when the running count of failures owed steps up.
	if math.Floor(n*f.ErrorRate) > math.Floor((n-1)*f.ErrorRate) {
		return f.ErrorStatus
	}
	return 0
}

// control is the JSON of /mock/control. Absent fields keep their values.
type control struct {
	TTFTMs               *float64 `json:"ttft_ms,omitempty"`
	TTFTPerPromptTokenMs *float64 `json:"ttft_per_prompt_token_ms,omitempty"`
	ITLMs                *float64 `json:"itl_ms,omitempty"`
	EmitTimestamps       *bool    `json:"emit_timestamps,omitempty"`

	MaxBatch          *int     `json:"max_batch,omitempty"`
	MaxQueue          *int     `json:"max_queue,omitempty"`
	ITLPerBatchMs     *float64 `json:"itl_per_batch_ms,omitempty"`
	KVCacheTokens     *int     `json:"kv_cache_tokens,omitempty"`
	PrefixCacheTokens *int     `json:"prefix_cache_tokens,omitempty"`

	ErrorRate      *float64 `json:"error_rate,omitempty"`
	ErrorStatus    *int     `json:"error_status,omitempty"`
	RetryAfterMs   *float64 `json:"retry_after_ms,omitempty"`
	StallAfter     *int     `json:"stall_after,omitempty"`
	StallMs        *float64 `json:"stall_ms,omitempty"`
	ResetAfter     *int     `json:"reset_after,omitempty"`
	MalformedAfter *int     `json:"malformed_after,omitempty"`
}

// handleControl changes the mock while it runs, so a test (or an operator
// rehearsing a failover) can degrade and restore a pool live:
//
//	curl -X POST localhost:8001/mock/control -d '{"ttft_ms": 900}'
//	curl -X POST localhost:8001/mock/control -d '{"error_rate": 0.2, "error_status": 503}'
//	curl -X POST localhost:8001/mock/control -d '{"max_batch": 4, "itl_per_batch_ms": 2}'
//	curl -X POST localhost:8001/mock/control -d '{"reset_after": 5}'
//
// GET returns the values in force.
func (s *Server) handleControl(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost:
		var c control
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_control", err.Error())
			return
		}
		cfg, f := s.Config(), *s.faults.Load()
		// Config uses zero for "default" and negative for "none".
		delay := func(ms float64) time.Duration {
			if d := time.Duration(ms * float64(time.Millisecond)); d > 0 {
				return d
			}
			return -1
		}
		if cfg.TTFT == 0 {
			cfg.TTFT = -1
		}
		if cfg.ITL == 0 {
			cfg.ITL = -1
		}
		if c.TTFTMs != nil {
			cfg.TTFT = delay(*c.TTFTMs)
		}
		if c.TTFTPerPromptTokenMs != nil {
			cfg.TTFTPerPromptToken = max(0, delay(*c.TTFTPerPromptTokenMs))
		}
		if c.ITLMs != nil {
			cfg.ITL = delay(*c.ITLMs)
		}
		// The other fields keep their Config and Faults meanings (zero: off
		// or default); a new prefix cache size starts a cold cache.
		ms := func(dst *time.Duration, v *float64) {
			if v != nil {
				*dst = max(0, time.Duration(*v*float64(time.Millisecond)))
			}
		}
		set := func(dst *int, v *int) {
			if v != nil {
				*dst = *v
			}
		}
		if c.EmitTimestamps != nil {
			cfg.EmitTimestamps = *c.EmitTimestamps
		}
		set(&cfg.MaxBatch, c.MaxBatch)
		set(&cfg.MaxQueue, c.MaxQueue)
		ms(&cfg.ITLPerBatch, c.ITLPerBatchMs)
		set(&cfg.KVCacheTokens, c.KVCacheTokens)
		set(&cfg.PrefixCacheTokens, c.PrefixCacheTokens)
		if c.ErrorRate != nil {
			f.ErrorRate = *c.ErrorRate
		}
		if c.ErrorStatus != nil {
			if *c.ErrorStatus < 400 || *c.ErrorStatus > 599 {
				writeError(w, http.StatusBadRequest, typeInvalidRequest, "invalid_control", "error_status must be 400-599")
				return
			}
			f.ErrorStatus = *c.ErrorStatus
		}
		ms(&f.RetryAfter, c.RetryAfterMs)
		set(&f.StallAfter, c.StallAfter)
		ms(&f.Stall, c.StallMs)
		set(&f.ResetAfter, c.ResetAfter)
		set(&f.MalformedAfter, c.MalformedAfter)
		s.SetConfig(cfg)
		s.SetFaults(f)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeError(w, http.StatusMethodNotAllowed, typeInvalidRequest, "method_not_allowed", "use GET or POST")
		return
	}
	cfg, f := s.Config(), s.faults.Load()
	w.Header().Set("content-type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"ttft_ms": float64(cfg.TTFT) / 1e6, "ttft_per_prompt_token_ms": float64(cfg.TTFTPerPromptToken) / 1e6,
		"itl_ms": float64(cfg.ITL) / 1e6, "emit_timestamps": cfg.EmitTimestamps,
		"max_batch": cfg.MaxBatch, "max_queue": cfg.MaxQueue, "itl_per_batch_ms": float64(cfg.ITLPerBatch) / 1e6,
		"kv_cache_tokens": cfg.KVCacheTokens, "prefix_cache_tokens": cfg.PrefixCacheTokens,
		"error_rate": f.ErrorRate, "error_status": f.ErrorStatus, "retry_after_ms": float64(f.RetryAfter) / 1e6,
		"stall_after": f.StallAfter, "stall_ms": float64(f.Stall) / 1e6,
		"reset_after": f.ResetAfter, "malformed_after": f.MalformedAfter,
	})
}
