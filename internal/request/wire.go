package request

// Headers infergate sets. Clients cannot set them: every header with
// ReservedHeaderPrefix a client sends is removed by the gate.
const (
	ReservedHeaderPrefix = "x-infergate-"
	// ModelHeader is the routing header the gate sets from the body's
	// model; Envoy's routes (static, infergate's xDS, an HTTPRoute, a
	// VirtualService) match on it.
	ModelHeader = "x-infergate-model"
	// PoolHeader is a response header a route may add per backend to name
	// the pool (the Helm chart's Envoy Gateway HTTPRoute does).
	PoolHeader = "x-infergate-pool"
	// RoleHeader is the gRPC initial metadata key Envoy's grpc_service sets
	// to name the filter role ("gate" or "meter").
	RoleHeader = "x-infergate-filter"
	// ErrorHeader marks a response the gate answered itself (a denial).
	ErrorHeader = "x-infergate-error"
)

// MetadataNamespace is the dynamic-metadata namespace the gate writes (read
// by the meter, access logs and response-header formatters such as
// %DYNAMIC_METADATA(infergate:x-ratelimit-remaining-tokens)%), and the
// cluster-metadata namespace infergate's xDS server writes.
const MetadataNamespace = "infergate"

// Keys in MetadataNamespace.
const (
	// PoolsKey lists, in cluster metadata of a fallback aggregate cluster,
	// its pools in the order attempts try them.
	PoolsKey = "pools"
	// TraceparentKey carries the gate's span to the meter when Envoy sends
	// no trace context of its own.
	TraceparentKey = "traceparent"
)

// AggregatePrefix starts the name of the aggregate cluster a virtual model
// falls back through: AggregatePrefix + model + "/" + first pool.
const AggregatePrefix = "infergate-fallback/"

// RateLimitHeaders are the x-ratelimit-* response headers a policy's limits
// produce; each is also a key in MetadataNamespace, which Envoy's routes
// copy onto the response.
var RateLimitHeaders = [...]string{
	"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
	"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
}
