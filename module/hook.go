//go:build !infergate_panic_hook

package module

// hook is where a test build (tag infergate_panic_hook) forces a panic at a
// stage of a request; in every other build it does nothing.
func hook(map[string]string, string) {}
