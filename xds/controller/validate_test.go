package controller

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSLAAndTuningValidate(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		field string // "" for valid
	}{
		{"zero SLA", SLA{}.Validate(), ""},
		{"test SLA", testSLA.Validate(), ""},
		{"negative TTFT", SLA{TTFTP95: -1}.Validate(), "ttftP95"},
		{"negative ITL", SLA{ITLP95: -1}.Validate(), "itlP95"},
		{"error rate > 1", SLA{ErrorRate: 1.5}.Validate(), "errorRate"},
		{"negative queue", SLA{QueueDepth: -1}.Validate(), "queueDepth"},
		{"zero tuning", Tuning{}.Validate(), ""},
		{"defaults", Tuning{}.WithDefaults().Validate(), ""},
		{"upper bounds", Tuning{Step: MaxStep, ProbeWeight: MaxProbeWeight, MinSamples: MaxMinSamples, Hysteresis: 0.99}.Validate(), ""},
		{"no probe", Tuning{ProbeWeight: NoProbe}.Validate(), ""},
		{"negative window", Tuning{Window: -time.Second}.Validate(), "window"},
		{"negative min samples", Tuning{MinSamples: -1}.Validate(), "minSamples"},
		{"min samples beyond ring", Tuning{MinSamples: MaxMinSamples + 1}.Validate(), "minSamples"},
		{"negative interval", Tuning{Interval: -1}.Validate(), "interval"},
		{"step", Tuning{Step: MaxStep + 1}.Validate(), "step"},
		{"hysteresis 1", Tuning{Hysteresis: 1}.Validate(), "hysteresis"},
		{"negative hysteresis", Tuning{Hysteresis: -0.1}.Validate(), "hysteresis"},
		{"negative cooldown", Tuning{Cooldown: -1}.Validate(), "cooldown"},
		{"probe weight", Tuning{ProbeWeight: MaxProbeWeight + 1}.Validate(), "probeWeight"},
		{"negative prefill", Tuning{PrefillPerToken: -1}.Validate(), "prefillPerToken"},
		{"baseline < window", Tuning{BaselineWindow: time.Second}.Validate(), "baselineWindow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fes := FieldErrors(tt.err)
			if tt.field == "" {
				if tt.err != nil {
					t.Fatalf("unexpected error: %v", tt.err)
				}
				return
			}
			if len(fes) != 1 || fes[0].Field != tt.field || fes[0].Msg == "" {
				t.Fatalf("field errors %v, want one for %s", tt.err, tt.field)
			}
			var fe *FieldError
			if !errors.As(tt.err, &fe) || !strings.HasPrefix(tt.err.Error(), tt.field+": ") {
				t.Errorf("error %q is not a FieldError for %s", tt.err, tt.field)
			}
		})
	}
	if fes := FieldErrors(Tuning{Window: -1, Step: 200}.Validate()); len(fes) != 2 ||
		fes[0].Field != "window" || fes[1].Field != "step" {
		t.Errorf("several problems: %v", fes)
	}
}

// TestFieldNames checks a FieldError's yaml key maps back to the Go field
// VirtualModel.Validate names, for every field of SLA and Tuning.
func TestFieldNames(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[SLA](), reflect.TypeFor[Tuning]()} {
		for i := range typ.NumField() {
			f := typ.Field(i)
			key := f.Tag.Get("yaml")
			if key == "-" {
				key = strings.ToLower(f.Name[:1]) + f.Name[1:]
			}
			if key == "" || goField(typ, key) != f.Name {
				t.Errorf("%s.%s: yaml key %q maps to %q", typ.Name(), f.Name, key, goField(typ, key))
			}
		}
	}
}

func TestReason(t *testing.T) {
	tun := Tuning{}.WithDefaults()
	sla := SLA{TTFTP95: 300 * time.Millisecond, ITLP95: 50 * time.Millisecond, ErrorRate: 0.05, QueueDepth: 8}
	st := PoolStats{Samples: 40, ExcessTTFTP95: 250 * time.Millisecond, ITLP95: 20 * time.Millisecond, ErrorRate: 0.1, QueueDepth: 3}
	tests := []struct {
		name       string
		st         PoolStats
		itl        int
		breached   bool
		healthy    bool
		why        string
		sla        SLA
		overriding func(*PoolStats)
	}{
		{name: "breached", st: st, itl: 40, breached: true, sla: sla,
			why: "error rate 10.0% > SLA 5.0%"},
		{name: "band", st: st, itl: 40, sla: sla, overriding: func(s *PoolStats) { s.ErrorRate = 0 },
			why: "not yet healthy: excess TTFT p95 250ms >= 240ms (SLA 300ms less 20% hysteresis)"},
		{name: "healthy, ITL not judged", st: st, itl: 10, healthy: true, sla: sla,
			overriding: func(s *PoolStats) { s.ErrorRate, s.ExcessTTFTP95 = 0, 10*time.Millisecond },
			why:        "healthy: excess TTFT p95 10ms < 240ms; error rate 0.0% < 4.0%; queue depth 3 < 6"},
		{name: "no SLA", st: st, healthy: true, why: "healthy"},
		{name: "unknown", st: st, sla: sla, overriding: func(s *PoolStats) { s.Samples = 3 },
			why: "unknown: 3 samples in 30s < MinSamples 20"},
		{name: "unknown, queueing", st: st, sla: sla, breached: true, overriding: func(s *PoolStats) { s.Samples, s.QueueDepth = 3, 40 },
			why: "queue depth 40 > SLA 8 (3 samples)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st
			if tt.overriding != nil {
				tt.overriding(&st)
			}
			v := decide(st, tt.itl, tt.sla, tun)
			if v.breached != tt.breached || v.healthy != tt.healthy {
				t.Errorf("breached %v healthy %v, want %v %v", v.breached, v.healthy, tt.breached, tt.healthy)
			}
			if got := reason(v, tun); got != tt.why {
				t.Errorf("reason %q\n want %q", got, tt.why)
			}
		})
	}
}
