package infergate.ratelimit_test

import data.infergate.authz
import data.infergate.ratelimit
import data.infergate.testdata

chat(tenant, model) := {
	"principal": {"id": "key-1", "type": "api_key", "claims": {}},
	"tenant": tenant,
	"labels": {},
	"request": {
		"method": "POST",
		"path": "/v1/chat/completions",
		"api": "chat",
		"headers": {},
		"model": model,
		"virtual_model": "",
		"stream": true,
		"max_tokens": 256,
		"choices": 1,
		"estimated_prompt_tokens": 40,
		"previous_response_id": "",
		"background": false,
		"conversation": "",
		"prompt_id": "",
		"store": false,
	},
	"usage": {"requests": 0, "tokens": 0},
}

# The three limits of a completion request, for tenant on tier amounts.
expected(tenant, principal, model, rpm, tpm, otph) := {
	{
		"name": "requests-per-minute",
		"key": sprintf("tenant=%s/principal=%s", [tenant, principal]),
		"unit": "requests",
		"amount": rpm,
		"window": "1m",
	},
	{
		"name": "tenant-tokens-per-minute",
		"key": sprintf("tenant=%s", [tenant]),
		"unit": "total_tokens",
		"amount": tpm,
		"window": "1m",
	},
	{
		"name": "model-output-tokens-per-hour",
		"key": sprintf("tenant=%s/model=%s", [tenant, model]),
		"unit": "output_tokens",
		"amount": otph,
		"window": "1h",
	},
}

test_free_tier_limits if {
	ratelimit.limits == expected("initech", "key-1", "llama-3.1-8b-instruct", 20, 20000, 100000) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
}

test_standard_tier_limits if {
	ratelimit.limits == expected("globex", "key-1", "llama-3.1-70b-instruct", 120, 200000, 2000000) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("globex", "llama-3.1-70b-instruct")
}

test_premium_tier_limits if {
	ratelimit.limits == expected("acme", "key-1", "some-model", 600, 2000000, 20000000) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "some-model")
}

test_limits_follow_tier_label if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"labels": {"tier": "free"}})
	ratelimit.limits == expected("acme", "key-1", "llama-3.1-8b-instruct", 20, 20000, 100000) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_limits_keyed_per_principal_and_model if {
	inp := object.union(chat("acme", "m2"), {"principal": {"id": "key-2"}})
	keys := {l.key | some l in ratelimit.limits} with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
	keys == {"tenant=acme/principal=key-2", "tenant=acme", "tenant=acme/model=m2"}
}

test_anonymous_callers_share_a_budget if {
	inp := object.union(chat("playground", "qwen2.5-7b-instruct"), {"principal": {"id": "", "type": "anonymous"}})
	some l in ratelimit.limits with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
	l.unit == "requests"
	l.key == "tenant=playground/principal="
	l.amount == 20
}

test_model_listing_has_no_model_limit if {
	inp := object.union(chat("globex", ""), {"request": {"method": "GET", "path": "/v1/models", "max_tokens": 0}})
	units := {l.unit | some l in ratelimit.limits} with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
	units == {"requests", "total_tokens"}
	not ratelimit.reserve with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_no_limits_for_unknown_tenant if {
	count(ratelimit.limits) == 0 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("hooli", "llama-3.1-8b-instruct")
}

test_every_limit_well_formed if {
	every tenant in ["acme", "globex", "initech", "playground"] {
		limits := ratelimit.limits with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat(tenant, "llama-3.1-8b-instruct")
		count(limits) == 3
		every l in limits {
			l.unit in {"requests", "input_tokens", "output_tokens", "total_tokens"}
			is_number(l.amount)
			l.amount > 0
			l.window in {"1m", "1h"}
			l.key != ""
			l.name != ""
		}
	}
}

# Reservations: none stated, the gate's default applies; a request
# without max_tokens gets its tier's cap (authz.max_tokens), by label too.

test_no_reserve_rule if {
	not ratelimit.reserve with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
	not ratelimit.reserve with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as object.union(chat("globex", "llama-3.1-8b-instruct"), {"request": {"max_tokens": 0}})
}

test_cap_without_max_tokens if {
	inp := object.union(chat("globex", "llama-3.1-8b-instruct"), {"request": {"max_tokens": 0}})
	authz.max_tokens == 4096 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_cap_follows_tier_label if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"labels": {"tier": "free"}, "request": {"max_tokens": 0}})
	authz.max_tokens == 1024 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

# The search tier writes no output: no output budget, only requests and
# (input) tokens.
test_search_tier_limits if {
	inp := object.union(chat("vandelay", "bge-m3"), {"request": {"path": "/v1/embeddings", "api": "embeddings", "max_tokens": 0}})
	ratelimit.limits == {
		{
			"name": "requests-per-minute",
			"key": "tenant=vandelay/principal=key-1",
			"unit": "requests",
			"amount": 600,
			"window": "1m",
		},
		{
			"name": "tenant-tokens-per-minute",
			"key": "tenant=vandelay",
			"unit": "total_tokens",
			"amount": 1000000,
			"window": "1m",
		},
	} with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

# Budgets in money: the tenant's per day and month, its team's per month,
# and a key's own monthly budget, in pico-units.

money_limits(inp) := {l | some l in ratelimit.limits with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp; l.unit == "money"}

test_tenant_and_team_money_budgets if {
	inp := object.union(chat("soylent", "llama-3.1-8b-instruct"), {"labels": {"team": "search"}})
	money_limits(inp) == {
		{"name": "tenant-money-per-day", "key": "tenant=soylent", "unit": "money", "amount": 200000000000000, "window": "24h"},
		{"name": "tenant-money-per-month", "key": "tenant=soylent", "unit": "money", "amount": 5000000000000000, "window": "month"},
		{"name": "team-money-per-month", "key": "tenant=soylent/team=search", "unit": "money", "amount": 500000000000000, "window": "month"},
	}
}

test_no_team_budget_for_other_teams if {
	inp := object.union(chat("soylent", "llama-3.1-8b-instruct"), {"labels": {"team": "ads"}})
	{l.name | some l in money_limits(inp)} == {"tenant-money-per-day", "tenant-money-per-month"}
}

test_key_budget_month if {
	inp := object.union(chat("acme", "m"), {"principal": {"budget_month": 500000000000000}})
	money_limits(inp) == {{
		"name": "key-money-per-month", "key": "tenant=acme/principal=key-1",
		"unit": "money", "amount": 500000000000000, "window": "month",
	}}
}

test_no_money_limits_without_budgets if {
	count(money_limits(chat("acme", "m"))) == 0
	count(money_limits(object.union(chat("acme", "m"), {"principal": {"budget_month": 0}}))) == 0
}
