package request

import (
	"crypto/sha256"
	"encoding/hex"
)

// The Gateway API Inference Extension's request headers
// (sigs.k8s.io/gateway-api-inference-extension, pkg/epp/metadata, v1.4.0):
// what an Endpoint Picker reads of a request, and what it and the proxy
// write. A client may send any of them; the gate removes them all and sets
// the two that say who is calling from the verified caller and the policy.
const (
	// FairnessIDHeader names the flow the picker's flow control queues the
	// request in (its default: "default-flow").
	FairnessIDHeader = "x-gateway-inference-fairness-id"
	// ObjectiveHeader names the InferenceObjective (priority: negative is
	// sheddable) the request runs under.
	ObjectiveHeader = "x-gateway-inference-objective"
	// EndpointHeader is the picker's choice (ip:port, or a list tried in
	// order); the pool's ORIGINAL_DST cluster routes on it.
	EndpointHeader = "x-gateway-destination-endpoint"
	// EndpointSubsetKey restricts the endpoints the picker may choose
	// (metadata in the protocol; removed as a header all the same).
	EndpointSubsetKey = "x-gateway-destination-endpoint-subset"
	// EndpointServedKey is the endpoint that served (metadata in the
	// protocol; removed as a header all the same).
	EndpointServedKey = "x-gateway-destination-endpoint-served"
	// ModelRewriteHeader makes the picker send the request upstream
	// under another model name.
	ModelRewriteHeader = "x-gateway-model-name-rewrite"
)

// PickerHeaders are the Inference Extension's header names a client's
// request loses at the gate, whatever the gate then sets.
var PickerHeaders = []string{FairnessIDHeader, ObjectiveHeader, EndpointHeader,
	EndpointSubsetKey, EndpointServedKey, ModelRewriteHeader}

// Bounds of the identity the gate tells the picker.
const (
	// MaxFairnessIDBytes bounds a fairness id: it keys a queue in the
	// picker's flow control.
	MaxFairnessIDBytes = 128
	// MaxObjectiveBytes is a Kubernetes object name's (RFC 1123 DNS
	// subdomain): an objective names an InferenceObjective.
	MaxObjectiveBytes = 253
)

// ValidFairnessID reports whether s may go to the picker as a fairness id
// as it is: 1 to MaxFairnessIDBytes of ASCII letters, digits and
// "-._~:/@+" (nothing a header, a list or a log line reads specially).
func ValidFairnessID(s string) bool {
	if len(s) == 0 || len(s) > MaxFairnessIDBytes {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == ':', c == '/', c == '@', c == '+':
		default:
			return false
		}
	}
	return true
}

// ValidObjective reports whether s names a Kubernetes object (an RFC 1123
// DNS subdomain: lower-case letters, digits, '-' and '.', starting and
// ending with a letter or digit, at most MaxObjectiveBytes).
func ValidObjective(s string) bool {
	if len(s) == 0 || len(s) > MaxObjectiveBytes {
		return false
	}
	for i := range len(s) {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		switch {
		case alnum:
		case (c == '-' || c == '.') && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// TenantFairnessID is a tenant's fairness id: the tenant itself when it
// is a valid one, else "sha256=" and the first 32 hex digits of its
// SHA-256 (a tenant from a JWT claim may hold anything). '=' is not a
// fairness-id character, so no tenant's own name can be another's hash.
// "" for no tenant.
func TenantFairnessID(tenant string) string {
	if tenant == "" || ValidFairnessID(tenant) {
		return tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	return "sha256=" + hex.EncodeToString(sum[:16])
}
