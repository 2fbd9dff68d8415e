# The bundled tests' own tiers and tenants: the example data.yaml as it was
# written beside them. Every assertion of authz_test.rego and
# ratelimit_test.rego evaluates with data.infergate.tiers and .tenants
# replaced by these, so an operator edits data.yaml freely (a tenant, a
# budget, a tier's models) and the tests that ship with the policy, which
# run at every load, still hold.
package infergate.testdata

example := {
	"tiers": {
		"free": {
			"rank": 0,
			"models": [
				"llama-3.1-8b-instruct",
				"qwen2.5-7b-instruct",
				"bge-m3",
			],
			"max_tokens": 1024,
			"requests_per_minute": 20,
			"tokens_per_minute": 20000,
			"output_tokens_per_hour": 100000,
			"checks": [],
			"objective": "sheddable",
		},
		"standard": {
			"rank": 1,
			"models": [
				"llama-3.1-8b-instruct",
				"qwen2.5-7b-instruct",
				"llama-3.1-70b-instruct",
				"mixtral-8x22b-instruct",
				"bge-m3",
			],
			"max_tokens": 4096,
			"requests_per_minute": 120,
			"tokens_per_minute": 200000,
			"output_tokens_per_hour": 2000000,
			"checks": [],
			"objective": "standard",
			"allow_unbounded": [
				"previous_response_id",
			],
		},
		"premium": {
			"rank": 2,
			"models": [
				"*",
			],
			"max_tokens": 16384,
			"requests_per_minute": 600,
			"tokens_per_minute": 2000000,
			"output_tokens_per_hour": 20000000,
			"checks": [],
			"objective": "critical",
			"allow_unbounded": [
				"previous_response_id",
				"conversation",
				"prompt",
			],
		},
		"search": {
			"rank": -1,
			"apis": [
				"embeddings",
			],
			"models": [
				"bge-m3",
				"nomic-embed-text-v1.5",
			],
			"requests_per_minute": 600,
			"tokens_per_minute": 1000000,
			"checks": [],
			"objective": "sheddable",
		},
	},
	"tenants": {
		"acme": {
			"tier": "premium",
		},
		"globex": {
			"tier": "standard",
		},
		"vandelay": {
			"tier": "search",
		},
		"initech": {
			"tier": "free",
		},
		"soylent": {
			"tier": "standard",
			"budgets": {
				"tenant": {
					"day": 200,
					"month": 5000,
				},
				"teams": {
					"search": {
						"month": 500,
					},
				},
			},
		},
		"playground": {
			"tier": "free",
			"allow_anonymous": true,
		},
	},
}
