# Authorization: who may call which model, on which path, with how many
# tokens. An example to copy and adapt: tenants and tiers live in data.yaml;
# the input is described in docs/policy-input.schema.json.
#
# The gate reads allow, reason, status, checks, max_tokens,
# allow_unbounded, objective and fairness_id from this package. The denials below are tried in order
# and the first that matches is the answer; a request that matches none is
# allowed.
#
# Every decision evaluates these rules, so they are kept few and cheap:
# each rule is computed at most once per decision, lookups go through
# objects keyed by the input (path, method, tenant, tier) rather than loops.
package infergate.authz

# Fail closed: nothing is allowed unless no denial applies.
default allow := false

allow if not denial

# Why the request was allowed or denied. Keep reasons short and free of
# secrets: the gate returns them to the caller and records them.
reason := concat("", ["allowed on the ", tier_name, " tier"]) if {
	allow
} else := denial.reason

# The HTTP status of a denial.
status := denial.status if not allow

# The largest output a request may ask for on its tier (max_tokens,
# max_completion_tokens, a response's max_output_tokens, a message's
# max_tokens; a larger one is denied below). It is also the *effective*
# output cap of a request that sets none: the gate reserves it (times
# n/best_of) and sends it upstream, so the model server cannot write more
# than was reserved. Undefined (a tier without max_tokens): the gate's
# ratelimit.defaultMaxTokens is reserved and nothing is sent.
max_tokens := tier.max_tokens if route.output

# External checks (configured in the gate, e.g. moderation) that an allowed
# completion request must also pass, per tier.
checks contains check if {
	some check in tier.checks # first: most tiers have none
	allow
	route.model
}

# The request fields whose cost the gate cannot bound before the request
# runs that a tier accepts (data.yaml's allow_unbounded): a response's
# previous_response_id, conversation or stored prompt adds input the gate
# never sees (the pool's usage is charged when the response ends), and a
# background response answers with no usage at all (its whole reservation
# is kept). The gate refuses a request carrying one not named here.
allow_unbounded contains field if {
	some field in tier.allow_unbounded
	allow
}

# What an Endpoint Picker (Gateway API Inference Extension) is told of an
# allowed request: the InferenceObjective it runs under, i.e. its priority
# when the pool saturates (data.yaml: free and search sheddable, standard,
# premium critical). The gate sends it as x-gateway-inference-objective,
# with the tenant as x-gateway-inference-fairness-id (define fairness_id
# to queue by something else, e.g. the principal), and removes whatever the
# client sent under those names. Leave both undefined for a request that
# goes to a hosted API: the headers, and the tenant's name, then stay home.
objective := tier.objective if allow

# The endpoints served, by path and method. model: true marks the
# inference endpoints, which name a model (input.request.api says which
# API); output: true those of them that generate tokens.
route := {
	"/v1/chat/completions": {"POST": {"model": true, "output": true}},
	"/v1/completions": {"POST": {"model": true, "output": true}},
	"/v1/responses": {"POST": {"model": true, "output": true}},
	"/v1/messages": {"POST": {"model": true, "output": true}},
	"/v1/messages/count_tokens": {"POST": {"model": true, "output": false}},
	"/v1/embeddings": {"POST": {"model": true, "output": false}},
	"/v1/models": {"GET": {"model": false, "output": false}},
}[input.request.path][input.request.method]

tenant := data.infergate.tenants[input.tenant]

# The tier a request runs at: the tenant's, unless the credential carries a
# tier label (a key file label, or a JWT label claim) naming a tier of the
# same or a lower rank, e.g. a batch key restricted to free-tier models. A
# label naming a higher or an unknown tier is denied below.
tier_name := input.labels.tier if {
	data.infergate.tiers[input.labels.tier].rank <= data.infergate.tiers[tenant.tier].rank
} else := tenant.tier

tier := data.infergate.tiers[tier_name]

# An API key or a JWT with a subject identifies the caller. Anonymous
# callers are admitted only where the tenant or its tier says so.
identified if {
	input.principal.type in {"api_key", "jwt"}
	input.principal.id != ""
} else if {
	input.principal.type == "anonymous"
	tenant.allow_anonymous == true
} else if {
	input.principal.type == "anonymous"
	data.infergate.tiers[tenant.tier].allow_anonymous == true
}

model_allowed if {
	input.request.model in tier.models
} else if {
	"*" in tier.models
}

# The APIs a tier may use (input.request.api): every one when its apis
# are left out; count_tokens goes with messages.
api_allowed if {
	not tier.apis
} else if {
	input.request.api in tier.apis
} else if {
	"*" in tier.apis
} else if {
	input.request.api == "count_tokens"
	"messages" in tier.apis
}

# The denials, in order.
denial := {"status": 401, "reason": "missing credentials"} if {
	not identified
} else := {
	"status": 404,
	"reason": sprintf("no route for %s %s", [input.request.method, input.request.path]),
} if {
	not route
} else := {"status": 403, "reason": sprintf("unknown tenant %q", [input.tenant])} if {
	not tenant
} else := {
	"status": 403,
	"reason": sprintf("tier label %q is not allowed for this tenant", [input.labels.tier]),
} if {
	# tier_name is the label only when the label is allowed
	input.labels.tier != tier_name
} else := {"status": 403, "reason": sprintf("tier %q is not configured", [tier_name])} if {
	not tier
} else := {"status": 400, "reason": "model is required"} if {
	route.model
	input.request.model == ""
} else := {
	"status": 403,
	"reason": sprintf("the %s API is not available on the %s tier", [input.request.api, tier_name]),
} if {
	route.model
	not api_allowed
} else := {
	"status": 403,
	"reason": sprintf("model %q is not available on the %s tier", [input.request.model, tier_name]),
} if {
	route.model
	not model_allowed
} else := {
	"status": 400,
	"reason": sprintf(
		"max_tokens %d exceeds the %s tier's limit of %d",
		[input.request.max_tokens, tier_name, tier.max_tokens],
	),
} if {
	route.output
	input.request.max_tokens > tier.max_tokens
}
