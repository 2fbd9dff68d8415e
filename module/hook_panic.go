//go:build infergate_panic_hook

package module

// PanicHeader names the stage at which a test build panics (request_headers,
// decide, response_headers, response_body): the proof that a panic fails
// its request closed and leaves Envoy serving. Never in a shipped build.
const PanicHeader = "x-test-panic-at"

func hook(h map[string]string, stage string) {
	if h[PanicHeader] == stage {
		panic("forced by " + PanicHeader + ": " + stage)
	}
}
