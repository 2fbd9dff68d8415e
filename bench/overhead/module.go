package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"

	"gopkg.in/yaml.v3"
)

// The gate and the meter inside Envoy: the variant "module" runs
// envoy/overhead.yaml with its two ext_proc filters replaced by the
// dynamic module's filter as envoy/snippet-module.yaml has it
// (cmd/infergate-module, built here), reading the same infergate
// configuration file; no infergate process. Plain Envoy is measured in the
// same phases: the lane "Envoy + infergate module" beside plain Envoy and
// the ext_proc path.

const moduleKey = "module"

func moduleVariant() variant {
	return variant{Key: moduleKey, Title: "Envoy + infergate: ext_proc vs the dynamic module (Envoy + infergate module)", withPlain: true,
		Baseline: "the gate and the meter over ext_proc (two gRPC streams per request, infergate a process of its own)",
		Changed:  "cmd/infergate-module in Envoy's process (envoy/snippet-module.yaml): the same cores, no gRPC, no copies",
		spec:     moduleSpec, phases: wasmMeterPhases}
}

func moduleSpec(h *harness) (gatewaySpec, func(), error) {
	dir := filepath.Join(h.work, "module")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return gatewaySpec{}, nil, err
	}
	h.logf("building the dynamic module")
	cmd := exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", filepath.Join(dir, "libinfergate.so"), "./cmd/infergate-module")
	cmd.Dir = h.opts.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return gatewaySpec{}, nil, fmt.Errorf("building the module: %w\n%s", err, out)
	}
	// The configuration file startGateway writes for this stack.
	rendered, err := render(filepath.Join(h.opts.Root, "envoy/snippet-module.yaml"), map[string]string{
		"LISTEN_PORT": "0", "ADMIN_PORT": "0", "POOL_A_PORT": "0", "POOL_B_PORT": "0",
		"INFERGATE_CONFIG": filepath.Join(h.work, moduleKey+"-infergate.yaml"),
	})
	if err != nil {
		return gatewaySpec{}, nil, err
	}
	var src map[string]any
	if err := yaml.Unmarshal([]byte(rendered), &src); err != nil {
		return gatewaySpec{}, nil, err
	}
	filter, err := dig(src, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "http_filters", 0)
	if err != nil {
		return gatewaySpec{}, nil, fmt.Errorf("envoy/snippet-module.yaml: %w", err)
	}
	return gatewaySpec{module: true, envoyEnv: []string{"GODEBUG=cgocheck=0", "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + dir},
		envoy: func(doc map[string]any) error {
			hcm, err := dig(doc, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
			if err != nil {
				return err
			}
			m := hcm.(map[string]any)
			fs, _ := m["http_filters"].([]any)
			fs = slices.DeleteFunc(fs, func(f any) bool {
				name, _ := f.(map[string]any)["name"].(string)
				// The module is the gate, the meter and the usage filter.
				return name == "infergate.gate" || name == "infergate.usage" || name == "infergate.meter"
			})
			m["http_filters"] = append([]any{filter}, fs...)
			return nil
		}}, nil, nil
}
