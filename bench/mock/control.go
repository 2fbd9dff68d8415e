package mock

import (
	"encoding/json"
	"math"
	"net/http"
	"time"
)

// Faults make a share of completion requests fail, spread evenly (not at
// random) so that a test sees exactly the rate it set.
type Faults struct {
	ErrorRate   float64 // 0..1
	ErrorStatus int     // e.g. 503 or 429; default 503
}

// SetConfig replaces the cadence for requests that start from now on.
func (s *Server) SetConfig(cfg Config) {
	c := cfg.normalized()
	s.cfg.Store(&c)
}

// Config is the cadence in force.
func (s *Server) Config() Config { return *s.cfg.Load() }

// SetFaults replaces the fault injection for requests that start from now on.
func (s *Server) SetFaults(f Faults) {
	if f.ErrorStatus == 0 {
		f.ErrorStatus = http.StatusServiceUnavailable
	}
	f.ErrorRate = min(max(f.ErrorRate, 0), 1)
	s.faults.Store(&f)
}

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
	ErrorRate            *float64 `json:"error_rate,omitempty"`
	ErrorStatus          *int     `json:"error_status,omitempty"`
}

// handleControl changes the mock while it runs, so a test (or an operator
// rehearsing a failover) can degrade and restore a pool live:
//
//	curl -X POST localhost:8001/mock/control -d '{"ttft_ms": 900}'
//	curl -X POST localhost:8001/mock/control -d '{"error_rate": 0.2, "error_status": 503}'
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
		"itl_ms": float64(cfg.ITL) / 1e6, "error_rate": f.ErrorRate, "error_status": f.ErrorStatus,
	})
}
