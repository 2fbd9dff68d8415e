# Rate limits: the budgets that apply to a request, per tier (data.yaml).
# The gate charges every limit below at admission, atomically: a request is
# admitted only if all of them have room. Token limits are charged with a
# reservation (estimated prompt + effective max_tokens × choices, see the
# end of this file) and settled with the real usage when the response ends.
#
# A limit's key names the counter: requests with the same key and unit
# share a budget. Build keys from input fields so they say whose budget it
# is; tenants come from trusted configuration, so "tenant=<t>/..." keys
# cannot collide across tenants.
package infergate.ratelimit

import data.infergate.authz.tier

# Requests per minute, per credential. Anonymous callers (where a tenant
# admits them) have no id and share one budget per tenant.
limits contains {
	"name": "requests-per-minute",
	"key": concat("", ["tenant=", input.tenant, "/principal=", input.principal.id]),
	"unit": "requests",
	"amount": tier.requests_per_minute,
	"window": "1m",
}

# Prompt + completion tokens per minute, per tenant.
limits contains {
	"name": "tenant-tokens-per-minute",
	"key": concat("", ["tenant=", input.tenant]),
	"unit": "total_tokens",
	"amount": tier.tokens_per_minute,
	"window": "1m",
}

# Completion tokens per hour, per tenant and model.
limits contains {
	"name": "model-output-tokens-per-hour",
	"key": concat("", ["tenant=", input.tenant, "/model=", input.request.model]),
	"unit": "output_tokens",
	"amount": tier.output_tokens_per_hour,
	"window": "1h",
} if {
	input.request.model != ""
}

# No `reserve` rule: the gate's default (estimated prompt + effective
# max_tokens × choices) is right for these tiers. A request without
# max_tokens reserves, and is sent upstream with, its tier's cap
# (authz.max_tokens). Define reserve only to reserve something else; a
# field it leaves out keeps the gate's default.
