// Package request is the contract between infergate's parts: what the gate
// knows when it decides (Admission), what a policy answers (Verdict), what
// the meter reports when a response ends (Settlement, Stamp), and the names
// on the wire between Envoy, infergate and its control plane.
//
// It is a leaf: it imports nothing of the project but internal/openai, so
// the Envoy adapter (extproc), the policy side (internal/admission), the
// request log and the control plane (xds) all depend on it and not on each
// other.
package request
