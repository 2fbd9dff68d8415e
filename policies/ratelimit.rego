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

# Budgets in money, beside the token budgets: per tenant and per team (the
# key's team label), for the windows data.yaml names (minute, hour, day,
# or the calendar month, UTC), and per API key for the monthly budget its
# entry carries (`infergate keys create --budget-usd-month 500`). The gate
# reserves the request's worst-case cost (input.cost.reservation.cost:
# every prompt token at the model's dearest input price, every output token
# at its output price, over the model's pools) and settles the real one.
# Amounts are pico-units of the prices' currency (10⁻¹²), the unit of
# input.cost and input.principal.budget_month. The gate refuses a request
# of a model without a price that a money limit applies to.

pico := 1000000000000

money_windows := {"minute": "1m", "hour": "1h", "day": "24h", "month": "month"}

budgets := data.infergate.tenants[input.tenant].budgets

limits contains {
	"name": concat("", ["tenant-money-per-", period]),
	"key": concat("", ["tenant=", input.tenant]),
	"unit": "money",
	"amount": amount * pico,
	"window": money_windows[period],
} if {
	some period, amount in budgets.tenant
}

limits contains {
	"name": concat("", ["team-money-per-", period]),
	"key": concat("", ["tenant=", input.tenant, "/team=", input.labels.team]),
	"unit": "money",
	"amount": amount * pico,
	"window": money_windows[period],
} if {
	some period, amount in budgets.teams[input.labels.team]
}

limits contains {
	"name": "key-money-per-month",
	"key": concat("", ["tenant=", input.tenant, "/principal=", input.principal.id]),
	"unit": "money",
	"amount": input.principal.budget_month,
	"window": "month",
} if {
	input.principal.budget_month > 0
}

# No `reserve` rule: the gate's default (estimated prompt + effective
# max_tokens × choices) is right for these tiers. A request without
# max_tokens reserves, and is sent upstream with, its tier's cap
# (authz.max_tokens). Define reserve only to reserve something else; a
# field it leaves out keeps the gate's default.
