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
	// ErrorHeader marks a response the gate answered itself: a denial (the
	// error's code), or GET /v1/models (empty). Envoy's local_reply_config
	// leaves such responses alone.
	ErrorHeader = "x-infergate-error"
)

// MetadataNamespace is the dynamic-metadata namespace the gate writes, one
// key per field of its decision (read by access logs and response-header
// formatters such as
// %DYNAMIC_METADATA(infergate:x-ratelimit-remaining-tokens)%, and by a meter
// whose Envoy filter still forwards it), and the cluster-metadata namespace
// infergate's xDS server writes.
const MetadataNamespace = "infergate"

// Keys in MetadataNamespace.
const (
	// PoolsKey lists, in cluster metadata of a fallback aggregate cluster,
	// its pools in the order attempts try them.
	PoolsKey = "pools"
	// PoolOrderKey is PoolsKey's list as one string (a JSON array), in the
	// same cluster metadata: Envoy's CEL attributes carry a string, not a
	// list (a list arrives as the text "CelList value").
	PoolOrderKey = "pool_order"
	// TraceparentKey carries the gate's span to the meter when Envoy sends
	// no trace context of its own.
	TraceparentKey = "traceparent"
	// UsageAddedKey is true on a stream whose usage-only event the gate
	// asked for on the client's behalf: the proxy removes it after the
	// meter has read it (envoy/snippet.yaml's infergate.usage filter).
	UsageAddedKey = "usage_added"
)

// The meter's wire. The gate also writes what the meter needs as one
// compact, versioned string (MeterKey in MeterNamespace, its own namespace
// so that it can be forwarded alone), which Envoy hands to the meter once
// per request as an attribute (MeterAttribute), instead of copying a
// forwarded namespace into every message, body chunks included.
const (
	MeterNamespace = "infergate.meter"
	MeterKey       = "m"
	// MeterAttribute is the CEL expression naming it, as the meter
	// filter's request_attributes list it; Envoy keys the value by this
	// text.
	MeterAttribute = "metadata.filter_metadata['" + MeterNamespace + "']['" + MeterKey + "']"
	// PoolOrderAttribute names PoolOrderKey of the route's cluster.
	PoolOrderAttribute = "xds.cluster_metadata.filter_metadata['" + MetadataNamespace + "']['" + PoolOrderKey + "']"
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
	"x-ratelimit-limit-money", "x-ratelimit-remaining-money", "x-ratelimit-reset-money",
}
