package gate

import (
	"slices"
	"strings"
)

// ForwardedHeaders are the request headers the shipped gate filters forward to
// the gate (forward_rules in envoy/snippet.yaml; a test keeps them equal):
// what the gate reads (the route's, the body's type, the request id, the
// credential) and the policy input's by default (auth.policyHeaders), with
// every header named request.ReservedHeaderPrefix* under either spelling (a
// client's are removed). A header outside them never reaches the gate.
var ForwardedHeaders = []string{":method", ":path", "content-type", "x-request-id", "authorization", "x-api-key", "user-agent"}

// UnforwardedHeaders returns the headers of names that the shipped gate
// filters do not forward (see ForwardedHeaders).
func UnforwardedHeaders(names []string) []string {
	var out []string
	for _, n := range names {
		n = strings.ToLower(n)
		if !slices.Contains(ForwardedHeaders, n) && !Reserved(n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
