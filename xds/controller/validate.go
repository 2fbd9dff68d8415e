package controller

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// Bounds of Tuning checked by Validate.
const (
	MaxStep        = 100 // Tuning.Step
	MaxProbeWeight = 50  // Tuning.ProbeWeight, unless NoProbe
	// MaxMinSamples is Tuning.MinSamples at most: half the observations
	// kept per pool.
	MaxMinSamples = ringCap / 2
)

// FieldError is a problem with one field of an SLA or a Tuning, named by
// its yaml key (e.g. "probeWeight"; "baselineWindow" for BaselineWindow,
// which has none).
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// FieldErrors lists the *FieldError in err, as returned by SLA.Validate or
// Tuning.Validate: nil for nil, each of them for a joined error.
func FieldErrors(err error) []*FieldError {
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var out []*FieldError
	for _, e := range errs {
		var fe *FieldError
		if errors.As(e, &fe) {
			out = append(out, fe)
		}
	}
	return out
}

// fieldChecker collects FieldErrors.
type fieldChecker []error

func (c *fieldChecker) check(ok bool, field, format string, args ...any) {
	if !ok {
		*c = append(*c, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
}

// Validate checks the thresholds. It returns nil or the problems found,
// each a *FieldError, joined (see FieldErrors).
func (s SLA) Validate() error {
	var c fieldChecker
	c.check(s.TTFTP95 >= 0, "ttftP95", "must not be negative, got %s", s.TTFTP95)
	c.check(s.ITLP95 >= 0, "itlP95", "must not be negative, got %s", s.ITLP95)
	c.check(s.ErrorRate >= 0 && s.ErrorRate <= 1, "errorRate", "must be between 0 and 1, got %v", s.ErrorRate)
	c.check(s.QueueDepth >= 0, "queueDepth", "must not be negative, got %v", s.QueueDepth)
	return errors.Join(c...)
}

// Validate checks t as WithDefaults completes it: a zero field stands for
// its default, so the hysteresis is in [0, 1) here and (0, 1) once
// defaulted. It returns nil or the problems found, each a *FieldError,
// joined (see FieldErrors).
func (t Tuning) Validate() error {
	var c fieldChecker
	c.check(t.Window >= 0, "window", "must not be negative, got %s", t.Window)
	if t.MinSamples < 0 {
		c.check(false, "minSamples", "must not be negative, got %d", t.MinSamples)
	} else {
		c.check(t.MinSamples <= MaxMinSamples, "minSamples", "must be at most %d, got %d", MaxMinSamples, t.MinSamples)
	}
	c.check(t.Interval >= 0, "interval", "must not be negative, got %s", t.Interval)
	c.check(t.Step <= MaxStep, "step", "must be at most %d, got %d", MaxStep, t.Step)
	c.check(t.Hysteresis >= 0 && t.Hysteresis < 1, "hysteresis", "must be in [0, 1), got %v", t.Hysteresis)
	c.check(t.Cooldown >= 0, "cooldown", "must not be negative, got %s", t.Cooldown)
	c.check(t.ProbeWeight <= MaxProbeWeight || t.ProbeWeight == NoProbe, "probeWeight",
		"must be at most %d, got %d", MaxProbeWeight, t.ProbeWeight)
	c.check(t.PrefillPerToken >= 0, "prefillPerToken", "must not be negative, got %s", t.PrefillPerToken)
	if d := t.WithDefaults(); d.Window >= 0 { // a negative one is reported above
		c.check(d.BaselineWindow >= d.Window, "baselineWindow", "must be at least the window %s, got %s", d.Window, d.BaselineWindow)
	}
	return errors.Join(c...)
}

// Validate checks the model with its Tuning defaulted. Error messages name
// the offending field by its Go name (e.g. Tuning.ProbeWeight).
func (vm VirtualModel) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("virtual model %q: %s: %s", vm.Name, field, fmt.Sprintf(format, args...)))
	}
	if vm.Name == "" {
		bad("Name", "must not be empty")
	}
	if len(vm.Pools) == 0 {
		bad("Pools", "at least one pool is required")
	}
	seen := map[string]bool{}
	for i, p := range vm.Pools {
		switch {
		case p.Name == "":
			bad(fmt.Sprintf("Pools[%d].Name", i), "must not be empty")
		case seen[p.Name]:
			bad(fmt.Sprintf("Pools[%d].Name", i), "duplicate pool %q", p.Name)
		}
		seen[p.Name] = true
		if p.Priority < 0 {
			bad(fmt.Sprintf("Pools[%d].Priority", i), "must be >= 0, got %d", p.Priority)
		}
	}
	for _, fe := range FieldErrors(vm.SLA.Validate()) {
		bad("SLA."+goField(reflect.TypeFor[SLA](), fe.Field), "%s", fe.Msg)
	}
	for _, fe := range FieldErrors(vm.Tuning.Validate()) {
		bad("Tuning."+goField(reflect.TypeFor[Tuning](), fe.Field), "%s", fe.Msg)
	}
	return errors.Join(errs...)
}

// goField is the Go name of the field of struct type t named key in a
// FieldError: the two differ in case only (ttftP95 is TTFTP95).
func goField(t reflect.Type, key string) string {
	for i := range t.NumField() {
		if name := t.Field(i).Name; strings.EqualFold(name, key) {
			return name
		}
	}
	return key
}
