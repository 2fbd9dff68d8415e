package infergate.authz_test

import data.infergate.authz
import data.infergate.testdata

# A streaming chat completion from an API key of tenant, for model.
chat(tenant, model) := {
	"principal": {"id": "key-1", "type": "api_key", "claims": {}},
	"tenant": tenant,
	"labels": {},
	"request": {
		"method": "POST",
		"path": "/v1/chat/completions",
		"api": "chat",
		"headers": {"user-agent": "test"},
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

with_request(inp, fields) := object.union(inp, {"request": fields})

# The same request on another API, as the gate describes it.
on_api(inp, path, api) := with_request(inp, {"path": path, "api": api})

embeddings(tenant, model) := with_request(chat(tenant, model), {
	"path": "/v1/embeddings", "api": "embeddings",
	"stream": false, "max_tokens": 0,
})

count_tokens(tenant, model) := with_request(chat(tenant, model), {
	"path": "/v1/messages/count_tokens", "api": "count_tokens",
	"stream": false, "max_tokens": 0,
})

denied(inp, status, reason) if {
	not authz.allow with input as inp
	authz.status == status with input as inp
	authz.reason == reason with input as inp
}

# Tiers and models.

test_free_tier_small_model_allowed if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
	authz.reason == "allowed on the free tier" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
	not authz.status with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
}

test_free_tier_large_model_denied if {
	denied(
		chat("initech", "llama-3.1-70b-instruct"), 403,
		`model "llama-3.1-70b-instruct" is not available on the free tier`,
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_standard_tier_models if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("globex", "llama-3.1-8b-instruct")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("globex", "llama-3.1-70b-instruct")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("globex", "mixtral-8x22b-instruct")
	denied(chat("globex", "unlisted-model"), 403, `model "unlisted-model" is not available on the standard tier`) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_premium_tier_any_model if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "llama-3.1-70b-instruct")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "some-new-model")
	authz.reason == "allowed on the premium tier" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "some-new-model")
}

test_model_required if {
	denied(chat("acme", ""), 400, "model is required") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_unknown_tenant_denied if {
	denied(chat("hooli", "llama-3.1-8b-instruct"), 403, `unknown tenant "hooli"`) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(chat("", "llama-3.1-8b-instruct"), 403, `unknown tenant ""`) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_tenant_with_unconfigured_tier_denied if {
	denied(
		chat("acme", "llama-3.1-8b-instruct"), 403,
		`tier "gold" is not configured`,
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with data.infergate.tenants.acme.tier as "gold"
}

# Credentials.

test_anonymous_denied if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"principal": {"id": "", "type": "anonymous"}})
	denied(inp, 401, "missing credentials") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_anonymous_denied_before_route if {
	inp := object.union(
		chat("acme", "llama-3.1-8b-instruct"),
		{"principal": {"id": "", "type": "anonymous"}, "request": {"path": "/admin"}},
	)
	denied(inp, 401, "missing credentials") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_anonymous_allowed_where_tenant_says_so if {
	inp := object.union(chat("playground", "qwen2.5-7b-instruct"), {"principal": {"id": "", "type": "anonymous"}})
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp

	# but only on its own tier's models
	denied(
		with_request(inp, {"model": "llama-3.1-70b-instruct"}), 403,
		`model "llama-3.1-70b-instruct" is not available on the free tier`,
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_anonymous_allowed_where_tier_says_so if {
	inp := object.union(chat("globex", "llama-3.1-8b-instruct"), {"principal": {"id": "", "type": "anonymous"}})
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp with data.infergate.tiers.standard.allow_anonymous as true
	denied(inp, 401, "missing credentials") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with data.infergate.tiers.standard.allow_anonymous as "yes"
}

test_jwt_allowed if {
	inp := object.union(
		chat("globex", "llama-3.1-8b-instruct"),
		{"principal": {"id": "user@example.com", "type": "jwt", "claims": {"sub": "user@example.com"}}},
	)
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_credentials_without_id_denied if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"principal": {"id": ""}})
	denied(inp, 401, "missing credentials") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_unknown_principal_type_denied if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"principal": {"type": "mtls"}})
	denied(inp, 401, "missing credentials") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_missing_principal_denied if {
	inp := object.remove(chat("acme", "llama-3.1-8b-instruct"), ["principal"])
	denied(inp, 401, "missing credentials") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

# Paths and methods.

test_completions_allowed if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as with_request(chat("globex", "qwen2.5-7b-instruct"), {"path": "/v1/completions"})
}

test_models_listing_allowed if {
	inp := with_request(chat("initech", ""), {"method": "GET", "path": "/v1/models", "max_tokens": 0})
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
	authz.reason == "allowed on the free tier" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_models_listing_needs_credentials if {
	inp := object.union(
		with_request(chat("initech", ""), {"method": "GET", "path": "/v1/models"}),
		{"principal": {"id": "", "type": "anonymous"}},
	)
	denied(inp, 401, "missing credentials") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_unknown_path_denied if {
	denied(
		with_request(chat("acme", "llama-3.1-8b-instruct"), {"path": "/v1/audio/speech", "api": ""}), 404,
		"no route for POST /v1/audio/speech",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(
		with_request(chat("acme", "llama-3.1-8b-instruct"), {"path": "/admin/keys"}), 404,
		"no route for POST /admin/keys",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_wrong_method_denied if {
	denied(
		with_request(chat("acme", "llama-3.1-8b-instruct"), {"method": "GET"}), 404,
		"no route for GET /v1/chat/completions",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(
		with_request(chat("acme", ""), {"method": "POST", "path": "/v1/models"}), 404,
		"no route for POST /v1/models",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

# max_tokens caps.

test_max_tokens_at_cap_allowed if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as with_request(chat("initech", "llama-3.1-8b-instruct"), {"max_tokens": 1024})
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as with_request(chat("globex", "llama-3.1-8b-instruct"), {"max_tokens": 4096})
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as with_request(chat("acme", "llama-3.1-8b-instruct"), {"max_tokens": 16384})
}

test_max_tokens_above_cap_denied if {
	denied(
		with_request(chat("initech", "llama-3.1-8b-instruct"), {"max_tokens": 1025}), 400,
		"max_tokens 1025 exceeds the free tier's limit of 1024",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(
		with_request(chat("globex", "llama-3.1-8b-instruct"), {"max_tokens": 8192}), 400,
		"max_tokens 8192 exceeds the standard tier's limit of 4096",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(
		with_request(chat("acme", "llama-3.1-8b-instruct"), {"max_tokens": 16385}), 400,
		"max_tokens 16385 exceeds the premium tier's limit of 16384",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_max_tokens_unset_allowed if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as with_request(chat("initech", "llama-3.1-8b-instruct"), {"max_tokens": 0})
}

# The cap is the effective max_tokens of a request that sets none: the
# gate reserves it and sends it upstream.
test_max_tokens_cap_per_tier if {
	authz.max_tokens == 1024 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
	authz.max_tokens == 4096 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as with_request(chat("globex", "llama-3.1-8b-instruct"), {"max_tokens": 0})
	authz.max_tokens == 16384 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "some-new-model")
}

test_max_tokens_cap_follows_tier_label if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"labels": {"tier": "free"}})
	authz.max_tokens == 1024 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_no_max_tokens_cap if {
	# not on the model listing, nor on a tier without max_tokens
	inp := with_request(chat("initech", ""), {"method": "GET", "path": "/v1/models", "max_tokens": 0})
	not authz.max_tokens with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
	not authz.max_tokens with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("globex", "llama-3.1-8b-instruct")
		with data.infergate.tiers.standard as object.remove(data.infergate.tiers.standard, ["max_tokens"])
}

test_model_denial_before_max_tokens if {
	denied(
		with_request(chat("initech", "llama-3.1-70b-instruct"), {"max_tokens": 100000}), 403,
		`model "llama-3.1-70b-instruct" is not available on the free tier`,
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

# Tier labels.

test_tier_label_lowers_tier if {
	inp := object.union(chat("acme", "llama-3.1-70b-instruct"), {"labels": {"tier": "free"}})
	denied(inp, 403, `model "llama-3.1-70b-instruct" is not available on the free tier`) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as with_request(inp, {"model": "llama-3.1-8b-instruct"})
	authz.tier_name == "free" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_tier_label_same_tier_allowed if {
	inp := object.union(chat("globex", "llama-3.1-70b-instruct"), {"labels": {"tier": "standard"}})
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_tier_label_cannot_raise_tier if {
	inp := object.union(chat("initech", "llama-3.1-70b-instruct"), {"labels": {"tier": "premium"}})
	denied(inp, 403, `tier label "premium" is not allowed for this tenant`) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_unknown_tier_label_denied if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"labels": {"tier": "platinum"}})
	denied(inp, 403, `tier label "platinum" is not allowed for this tenant`) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_other_labels_ignored if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as object.union(chat("initech", "llama-3.1-8b-instruct"), {"labels": {"team": "ml"}})
}

# Checks.

test_no_checks_without_tier_checks if {
	count(authz.checks) == 0 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
		with data.infergate.tiers.free.checks as []
}

test_checks_per_tier if {
	authz.checks == {"moderation"} with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
		with data.infergate.tiers.free.checks as ["moderation"]

	# not for other tiers, nor for denied requests or the model listing
	count(authz.checks) == 0 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "llama-3.1-8b-instruct")
		with data.infergate.tiers.free.checks as ["moderation"]
	count(authz.checks) == 0 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-70b-instruct")
		with data.infergate.tiers.free.checks as ["moderation"]
	inp := with_request(chat("initech", ""), {"method": "GET", "path": "/v1/models"})
	count(authz.checks) == 0 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp with data.infergate.tiers.free.checks as ["moderation"]
}

# Every denial has exactly one status and reason: no two denial rules
# conflict, whatever the input.
test_denial_always_single_valued if {
	every inp in [
		chat("nobody", "x"),
		object.union(chat("nobody", "x"), {"principal": {"type": "anonymous", "id": ""}}),
		with_request(chat("initech", "x"), {"path": "/x", "max_tokens": 99999}),
		object.union(chat("initech", ""), {"labels": {"tier": "premium"}}),
	] {
		not authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
		authz.status >= 400 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
		is_string(authz.reason) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
	}
}

# APIs.

test_every_api_allowed if {
	inp := chat("globex", "llama-3.1-8b-instruct")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as on_api(inp, "/v1/completions", "completions")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as on_api(inp, "/v1/responses", "responses")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as on_api(inp, "/v1/messages", "messages")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as count_tokens("globex", "llama-3.1-8b-instruct")
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as embeddings("globex", "bge-m3")
}

test_search_tier_embeds_only if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as embeddings("vandelay", "bge-m3")
	authz.reason == "allowed on the search tier" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as embeddings("vandelay", "bge-m3")
	denied(chat("vandelay", "bge-m3"), 403, "the chat API is not available on the search tier") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(
		on_api(chat("vandelay", "bge-m3"), "/v1/responses", "responses"), 403,
		"the responses API is not available on the search tier",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(count_tokens("vandelay", "bge-m3"), 403, "the count_tokens API is not available on the search tier") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(embeddings("vandelay", "llama-3.1-8b-instruct"), 403, `model "llama-3.1-8b-instruct" is not available on the search tier`) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

# A key of any tenant labelled tier: search is held to embeddings; a
# search tenant's key cannot label itself up to a generating tier.
test_search_tier_label if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"labels": {"tier": "search"}})
	denied(inp, 403, "the chat API is not available on the search tier") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as object.union(embeddings("acme", "bge-m3"), {"labels": {"tier": "search"}})
	denied(
		object.union(chat("vandelay", "llama-3.1-8b-instruct"), {"labels": {"tier": "free"}}), 403,
		`tier label "free" is not allowed for this tenant`,
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

test_count_tokens_goes_with_messages if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as count_tokens("globex", "llama-3.1-8b-instruct")
		with data.infergate.tiers.standard.apis as ["messages"]
	denied(
		on_api(chat("globex", "llama-3.1-8b-instruct"), "/v1/chat/completions", "chat"), 403,
		"the chat API is not available on the standard tier",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with data.infergate.tiers.standard.apis as ["messages"]
}

# The cap holds each API's output: a response's max_output_tokens and a
# message's max_tokens arrive as input.request.max_tokens. Embeddings and
# token counts write nothing: no cap.
test_max_tokens_cap_per_api if {
	inp := with_request(chat("initech", "llama-3.1-8b-instruct"), {"max_tokens": 4096})
	denied(on_api(inp, "/v1/responses", "responses"), 400, "max_tokens 4096 exceeds the free tier's limit of 1024") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	denied(on_api(inp, "/v1/messages", "messages"), 400, "max_tokens 4096 exceeds the free tier's limit of 1024") with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
	authz.max_tokens == 1024 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as on_api(chat("initech", "llama-3.1-8b-instruct"), "/v1/responses", "responses")
	not authz.max_tokens with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as embeddings("initech", "bge-m3")
	not authz.max_tokens with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as count_tokens("initech", "llama-3.1-8b-instruct")
}

test_api_methods if {
	denied(
		with_request(embeddings("acme", "bge-m3"), {"method": "GET"}), 404,
		"no route for GET /v1/embeddings",
	) with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants
}

# A tier that names no apis (as before there were any) may use them all.
test_tier_without_apis_allows_every_api if {
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as embeddings("vandelay", "bge-m3")
		with data.infergate.tiers.search as object.remove(data.infergate.tiers.search, ["apis"])
	authz.allow with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("vandelay", "bge-m3")
		with data.infergate.tiers.search as object.remove(data.infergate.tiers.search, ["apis"])
}

# Costs the gate cannot bound: opted into per tier, never by default.

responses(tenant, fields) := with_request(chat(tenant, "llama-3.1-8b-instruct"), object.union(
	{"path": "/v1/responses", "api": "responses", "store": true},
	fields,
))

test_free_tier_accepts_no_unbounded_cost if {
	count(authz.allow_unbounded) == 0 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as responses("initech", {"background": true})
}

test_standard_tier_continues_stored_responses_only if {
	authz.allow_unbounded == {"previous_response_id"} with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as responses("globex", {"previous_response_id": "resp_1"})
}

test_premium_tier_accepts_stored_input_not_background if {
	inp := responses("acme", {"conversation": "conv_1", "prompt_id": "pmpt_1"})
	authz.allow_unbounded == {"previous_response_id", "conversation", "prompt"} with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
	not "background" in authz.allow_unbounded with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_no_unbounded_cost_on_a_denial if {
	count(authz.allow_unbounded) == 0 with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as responses("acme", {"path": "/v1/nope"})
}

# What an Endpoint Picker is told: the tier's objective, only when allowed.

test_free_tier_is_sheddable if {
	authz.objective == "sheddable" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-8b-instruct")
}

test_premium_tier_is_critical if {
	authz.objective == "critical" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "llama-3.1-70b-instruct")
}

test_a_premium_key_labelled_free_is_sheddable if {
	inp := object.union(chat("acme", "llama-3.1-8b-instruct"), {"labels": {"tier": "free"}})
	authz.objective == "sheddable" with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as inp
}

test_a_denied_request_has_no_objective if {
	not authz.objective with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("initech", "llama-3.1-70b-instruct")
}

test_no_fairness_id_the_gate_uses_the_tenant if {
	not authz.fairness_id with data.infergate.tiers as testdata.example.tiers with data.infergate.tenants as testdata.example.tenants with input as chat("acme", "llama-3.1-70b-instruct")
}
