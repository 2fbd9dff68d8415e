package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"

	"gopkg.in/yaml.v3"
)

// The in-Envoy meter against the slim ext_proc meter: the variant
// "wasm-meter" runs envoy/overhead.yaml with its meter filter and access
// log taken from envoy/wasm-meter.yaml (the proxy-wasm module, built here,
// and the gRPC access log to infergate), the gate unchanged. Plain Envoy is
// measured in the same phases, for the ratio.

const wasmMeterKey = "wasm-meter"

func wasmMeterVariant() variant {
	return variant{Key: wasmMeterKey, Title: "meter: ext_proc (observability) vs in Envoy (proxy-wasm)", withPlain: true,
		Baseline: "the ext_proc meter: one gRPC message per streamed chunk",
		Changed:  "cmd/infergate-meter-wasm in Envoy's Wasm filter (V8), one summary per request through the gRPC access log (envoy/wasm-meter.yaml)",
		spec:     wasmMeterSpec, phases: wasmMeterPhases}
}

// wasmMeterPhases are the variants' phases with the main run's c=64 streams
// before the c=8 ones (the variants' table shows the last streaming phase):
// what a meter costs per token shows under load.
func wasmMeterPhases(o options) []phaseSpec {
	var out []phaseSpec
	for _, p := range o.Variants {
		if p.Stream && len(out) > 0 && !out[len(out)-1].Stream {
			for _, m := range o.Phases {
				if m.Key == "stream-c64" {
					out = append(out, m)
				}
			}
		}
		out = append(out, p)
	}
	return out
}

func wasmMeterSpec(h *harness) (gatewaySpec, func(), error) {
	wasm := filepath.Join(h.work, "infergate-meter.wasm")
	h.logf("building the Wasm meter")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasm, "./cmd/infergate-meter-wasm")
	cmd.Dir = h.opts.Root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, err := cmd.CombinedOutput(); err != nil {
		return gatewaySpec{}, nil, fmt.Errorf("building the Wasm meter: %w\n%s", err, out)
	}
	// The filter and the access log as envoy/wasm-meter.yaml has them.
	rendered, err := render(filepath.Join(h.opts.Root, "envoy/wasm-meter.yaml"), map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "EXTPROC_PORT": "0", "POOL_A_PORT": "0", "POOL_B_PORT": "0",
		"JWKS_FILE": "", "OTLP_PORT": "0", "WASM_FILE": wasm,
	})
	if err != nil {
		return gatewaySpec{}, nil, err
	}
	var src map[string]any
	if err := yaml.Unmarshal([]byte(rendered), &src); err != nil {
		return gatewaySpec{}, nil, err
	}
	meter, err := filterConfig(src, "infergate.meter")
	if err != nil {
		return gatewaySpec{}, nil, fmt.Errorf("envoy/wasm-meter.yaml: %w", err)
	}
	accessLog, err := dig(src, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "access_log")
	if err != nil {
		return gatewaySpec{}, nil, fmt.Errorf("envoy/wasm-meter.yaml: access_log: %w", err)
	}
	return gatewaySpec{infergate: func(c map[string]any) {
		c["meter"] = map[string]any{"wasm": true} // the access-log service takes the summaries
	}, envoy: func(doc map[string]any) error {
		tc, err := filterConfig(doc, "infergate.meter")
		if err != nil {
			return err
		}
		clear(tc)
		for k, v := range meter {
			tc[k] = v
		}
		hcm, err := dig(doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
		if err != nil {
			return err
		}
		hcm.(map[string]any)["access_log"] = accessLog
		return nil
	}}, nil, nil
}

// wasmMeterTargets is the goal for the in-Envoy meter: Envoy +
// infergate CPU per streamed token over plain Envoy's, in the variant's
// streaming phase (both meters, and plain Envoy, under the same load).
func wasmMeterTargets(r *Report) []Target {
	var out []Target
	for _, v := range r.Variants {
		if v.Key != wasmMeterKey {
			continue
		}
		for _, ph := range v.Phases {
			if !ph.Stream {
				continue
			}
			envoy := cpuPer1k(ph, plain+"-envoy")
			if math.IsNaN(envoy) || envoy == 0 {
				continue
			}
			for _, name := range []string{gateway, wasmMeterKey} {
				ig, env := cpuPer1k(ph, name+"-infergate"), cpuPer1k(ph, name+"-envoy")
				out = append(out, Target{Name: fmt.Sprintf("%s: (infergate + Envoy) CPU per 1,000 streamed tokens over plain Envoy's (%s)", name, ph.Key),
					Limit: "≤ 1.2", Value: (ig + env) / envoy, Unit: "ratio", Met: (ig+env)/envoy <= 1.2,
					Note: fmt.Sprintf("infergate %.4f s + Envoy %.4f s, plain Envoy %.4f s per 1,000 tokens", ig, env, envoy)})
			}
		}
	}
	return out
}
