// Package config loads infergate's YAML configuration: parse strictly, fill
// defaults, validate once, and hand out an immutable value.
package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/xds/controller"
)

// Default is the embedded default configuration `infergate serve` runs with.
//
//go:embed default.yaml
var Default []byte

// filterName is an Envoy HTTP filter's name as a pool's endpointPicker.
var filterName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// Config is the whole configuration. Field names are the YAML keys.
type Config struct {
	ExtProc   ExtProc   `yaml:"extproc"`
	Admin     Admin     `yaml:"admin"`
	Gate      Gate      `yaml:"gate"`
	Meter     Meter     `yaml:"meter"`
	Auth      Auth      `yaml:"auth"`
	Policy    Policy    `yaml:"policy"`
	RateLimit RateLimit `yaml:"ratelimit"`
	// Reservations are how the gate's sealed reservations and fields are
	// kept honest: how long each may be settled, the keys that seal them.
	Reservations Reservations     `yaml:"reservations"`
	Checks       map[string]Check `yaml:"checks"`
	// Models are the model names the pools serve, as clients call them
	// (Envoy routes them by the x-infergate-model header). With the
	// virtual models they are what GET /v1/models lists (see Catalog).
	Models []string `yaml:"models"`
	// VirtualModels are the names clients call, each backed by pools whose
	// route weights the controller moves when a pool breaches its SLA.
	VirtualModels    []VirtualModel   `yaml:"virtualModels"`
	XDS              XDS              `yaml:"xds"`
	WeightSink       WeightSink       `yaml:"weightSink"`
	GatewayExtension GatewayExtension `yaml:"gatewayExtension"`
	Tracing          Tracing          `yaml:"tracing"`
	Log              Log              `yaml:"log"`

	// PoolModels, with neither Models nor VirtualModels, are listed on
	// GET /v1/models instead: what the pools serve, read from each one.
	PoolModels PoolModels `yaml:"poolModels"`

	// Prices are what the models cost: the stamp, the request log and
	// infergate.cost carry each request's cost at them, and a policy's
	// money limits reserve and settle at them. Read at start
	// (a change needs a restart, like the rest of this file).
	Prices Prices `yaml:"prices"`
}

// Prices are the models' prices per million tokens, in Currency.
type Prices struct {
	// Currency is the ISO 4217 code every price is in (three capital
	// letters).
	Currency string `yaml:"currency"`
	// Models are the prices by model name, as clients call it (a model or
	// a virtual model). A model not named here costs nothing on record.
	// With models or virtualModels set, every name here must be one of
	// them (a misspelt name would leave the real model unpriced).
	Models map[string]ModelPrice `yaml:"models"`
}

// ModelPrice is one model's price, and its prices on pools.
type ModelPrice struct {
	Price `yaml:",inline"`
	// Pools override the price on a pool (by its name, as the stamp names
	// it): hosted tiers price differently. A field left out is the
	// model's.
	Pools map[string]Price `yaml:"pools"`
}

// Price is the price of a million tokens of input, cached input and output.
type Price struct {
	// Input is the price of input neither read from nor written to the
	// pool's prompt cache.
	Input Decimal `yaml:"input"`
	// CachedInput is input read from the pool's prompt cache (OpenAI's
	// cached_tokens, Anthropic's cache_read_input_tokens); default: input.
	CachedInput Decimal `yaml:"cachedInput"`
	// CacheWriteInput is input written to the prompt cache (Anthropic's
	// cache_creation_input_tokens); default: input.
	CacheWriteInput Decimal `yaml:"cacheWriteInput"`
	// Output is the price of output (reasoning included). Left out, the
	// model is priced for input only (an embeddings model): a money budget
	// then refuses it on an API that generates output (403
	// model_output_not_priced), whose cost it could not bound, and such a
	// request's cost on record, without a money budget, is its input's.
	Output Decimal `yaml:"output"`
}

// Decimal is a price per million tokens in the currency, a plain decimal
// quoted or not ("0.15"; at most 6 decimal places, at most 1000), read
// exactly, never as a float.
type Decimal string

// UnmarshalYAML keeps a scalar's text: 0.15 is "0.15", never a float.
func (d *Decimal) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: a price is a decimal number, e.g. 0.15", n.Line)
	}
	*d = Decimal(n.Value)
	return nil
}

// maxPricedModels and maxPricedPools bound the price table.
const (
	maxPricedModels = 10_000
	maxPricedPools  = 64
)

func (p *Prices) validate() []error {
	var errs []error
	check := func(ok bool, path, format string, args ...any) {
		if !ok {
			errs = append(errs, &Error{Path: "prices." + path, Msg: fmt.Sprintf(format, args...)})
		}
	}
	check(len(p.Currency) == 3 && strings.Trim(p.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == "", "currency",
		"must be an ISO 4217 code (three capital letters, e.g. USD), got %q", p.Currency)
	check(len(p.Models) <= maxPricedModels, "models", "at most %d models, got %d", maxPricedModels, len(p.Models))
	for _, name := range slices.Sorted(maps.Keys(p.Models)) {
		m := p.Models[name]
		at := "models." + name
		check(strings.TrimSpace(name) != "", at, "a model's name is empty")
		check(m.Input != "", at, "input is required (output too, unless the model only reads input, as an embeddings model does)")
		check(len(m.Pools) <= maxPricedPools, at+".pools", "at most %d pools, got %d", maxPricedPools, len(m.Pools))
		for _, pool := range slices.Sorted(maps.Keys(m.Pools)) {
			check(strings.TrimSpace(pool) != "", at+".pools", "a pool's name is empty")
		}
		for _, f := range m.fields() {
			if f.v == "" {
				continue
			}
			_, err := price.Parse(string(f.v))
			check(err == nil, at+"."+f.name, "%v", err)
		}
	}
	return errs
}

// priceField is one price of a model's, named as in the file.
type priceField struct {
	name string
	v    Decimal
}

func (m *ModelPrice) fields() []priceField {
	out := m.Price.fields("")
	for _, pool := range slices.Sorted(maps.Keys(m.Pools)) {
		pp := m.Pools[pool]
		out = append(out, pp.fields("pools."+pool+".")...)
	}
	return out
}

func (p *Price) fields(prefix string) []priceField {
	return []priceField{{prefix + "input", p.Input}, {prefix + "cachedInput", p.CachedInput},
		{prefix + "cacheWriteInput", p.CacheWriteInput}, {prefix + "output", p.Output}}
}

// Table is the prices as the meter reads them. Call it on a validated
// configuration: a price it cannot read is 0.
func (p *Prices) Table() *price.Table {
	t := &price.Table{Currency: p.Currency}
	for name, m := range p.Models {
		var pools map[string]price.Price
		if len(m.Pools) > 0 {
			pools = make(map[string]price.Price, len(m.Pools))
			for pool, pp := range m.Pools {
				pools[pool] = pp.over(m.Price).resolve()
			}
		}
		t.Add(name, m.Price.resolve(), pools)
	}
	return t
}

// over is p with each field left out taken from base (a pool's from its
// model's, as written: a cache price the model left out stays out).
func (p Price) over(base Price) Price {
	for _, f := range []struct{ dst, def *Decimal }{{&p.Input, &base.Input}, {&p.CachedInput, &base.CachedInput},
		{&p.CacheWriteInput, &base.CacheWriteInput}, {&p.Output, &base.Output}} {
		if *f.dst == "" {
			*f.dst = *f.def
		}
	}
	return p
}

// resolve reads p's prices; a cache price left out is the input's.
func (p Price) resolve() price.Price {
	read := func(d Decimal) int64 {
		n, _ := price.Parse(string(d))
		return n
	}
	out := price.Price{Input: read(p.Input), CachedInput: read(p.CachedInput), CacheWrite: read(p.CacheWriteInput), Output: read(p.Output),
		InputOnly: p.Output == ""}
	if p.CachedInput == "" {
		out.CachedInput = out.Input
	}
	if p.CacheWriteInput == "" {
		out.CacheWrite = out.Input
	}
	return out
}

// unknownPricedModels are the priced models that are neither a model nor
// a virtual model, when the configuration names any: a typo there would
// leave the model clients call unpriced. With no catalog (models come from
// the pools or Envoy's routes alone) there is nothing to check against.
func (c *Config) unknownPricedModels() []error {
	catalog := c.Catalog()
	if len(catalog) == 0 {
		return nil
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Prices.Models)) {
		if slices.Contains(catalog, name) {
			continue
		}
		msg := fmt.Sprintf("no model or virtual model is named %q (models and virtualModels: %s)", name, strings.Join(catalog, ", "))
		if near := nearest(name, catalog); near != "" {
			msg += fmt.Sprintf("; did you mean %q?", near)
		}
		errs = append(errs, &Error{Path: "prices.models." + name, Msg: msg})
	}
	return errs
}

// Catalog is every model name a client may call: Models, then the
// virtual models. The gate lists them on GET /v1/models, each to the
// callers the policy lets call it; empty, it leaves /v1/models alone.
func (c *Config) Catalog() []string {
	out := slices.Clone(c.Models)
	for _, vm := range c.VirtualModels {
		out = append(out, vm.Name)
	}
	return out
}

// PoolModels are the pools whose own GET /v1/models the gate lists, merged
// and refreshed, when no models are configured.
type PoolModels struct {
	Pools []ModelsPool `yaml:"pools"`
	// Interval is how often every pool's list is read again.
	Interval time.Duration `yaml:"interval"`
	// KeepFor is how long a pool that stopped answering keeps its last
	// list; then its models drop out until it answers again.
	KeepFor time.Duration `yaml:"keepFor"`
	// Timeout bounds one read of a pool's list.
	Timeout time.Duration `yaml:"timeout"`
}

// ModelsPool is one pool whose models are listed.
type ModelsPool struct {
	// Name names the pool in logs (its Envoy cluster, as pools[].cluster).
	Name string `yaml:"name"`
	// URL is the pool's own model list, e.g. http://vllm:8000/v1/models.
	URL string `yaml:"url"`
	// APIKeyFile holds the bearer token the pool requires, if any (a
	// mounted Secret); read on every refresh.
	APIKeyFile string `yaml:"apiKeyFile"`
}

// maxModelsPools bounds poolModels.pools (each read every interval).
const maxModelsPools = 64

// VirtualModel is one routed name and its pools.
type VirtualModel struct {
	Name  string    `yaml:"name"`
	Pools []PoolRef `yaml:"pools"`
	// SLA thresholds; a zero value disables that check. The TTFT one
	// applies to the TTFT in excess of what the prompt length explains
	// (see README: length-normalised TTFT); queueDepth needs
	// pools[].metrics or pools[].inferencePool.
	SLA controller.SLA `yaml:"sla"`
	// Tuning of the weight controller; zero values take the defaults.
	Tuning controller.Tuning `yaml:"tuning"`
	Retry  *RetryRule        `yaml:"retry"`
}

// PoolRef is an Envoy cluster serving a virtual model; priority 0 is the
// primary, higher numbers are backups.
type PoolRef struct {
	// Cluster names the pool: its Envoy cluster, or with an HTTPRoute
	// weight sink a backendRef of the model's rule, by name or (two refs
	// of one name in two namespaces) namespace/name.
	Cluster  string `yaml:"cluster"`
	Priority int    `yaml:"priority"`
	// Metrics are the pool's model servers' Prometheus endpoints
	// (vLLM-style /metrics), scraped every interval for queue depth and
	// KV-cache usage; optional.
	Metrics []string `yaml:"metrics"`
	// InferencePool, instead of metrics, names the Gateway API Inference
	// Extension pool whose pods are scraped: the controller follows its
	// ready pods through the Kubernetes API (KUBECONFIG, else the pod's
	// service account) and reads every target port of each; optional.
	InferencePool *InferencePoolRef `yaml:"inferencePool"`
	// EndpointPicker, for a pool that is an InferencePool in plain Envoy
	// (its cluster the ORIGINAL_DST one behind the pool's Endpoint Picker),
	// names the picker's ext_proc filter in Envoy's chain, e.g.
	// inference-pool.epp (envoy/inference-pool-sla.yaml): the routes turn
	// it off for the virtual model's other pools. Needs weightSink.type xds
	// and no retries across pools; optional.
	EndpointPicker string `yaml:"endpointPicker"`
}

// InferencePoolRef names an InferencePool (inference.networking.k8s.io/v1).
type InferencePoolRef struct {
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
	// MetricsPath is the model servers' Prometheus path on each target
	// port (default /metrics).
	MetricsPath string `yaml:"metricsPath"`
}

// dnsLabel is a Kubernetes namespace's or InferencePool's name (RFC 1123).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// RetryRule sends eligible failures to another attempt (Envoy's retry
// policy on the virtual model's route).
type RetryRule struct {
	Attempts    uint32   `yaml:"attempts"`
	On          string   `yaml:"on"`
	StatusCodes []uint32 `yaml:"statusCodes"`
	// AcrossPools sends each retry to the next pool by priority instead of
	// the same pool (default true with two or more pools). It needs Envoy
	// to take its clusters from infergate's xDS too (cds_config; see
	// envoy/sla.yaml); false keeps retries inside the pool, RDS only.
	AcrossPools *bool `yaml:"acrossPools"`
}

// RetriesAcrossPools reports whether vm's retries go to the next pool.
func (vm VirtualModel) RetriesAcrossPools() bool {
	if vm.Retry == nil || len(vm.Pools) < 2 {
		return false
	}
	return vm.Retry.AcrossPools == nil || *vm.Retry.AcrossPools
}

// WeightSink is where the SLA controller's weights go.
type WeightSink struct {
	// Type is xds (infergate's own xDS server, for plain Envoy),
	// httpRouteFile (a Gateway API HTTPRoute in a file: Envoy Gateway's
	// standalone mode re-translates it on every change), httpRoute (the
	// HTTPRoute through the Kubernetes API) or virtualService (an Istio
	// VirtualService through the Kubernetes API).
	Type           string        `yaml:"type"`
	HTTPRoute      HTTPRouteFile `yaml:"httpRoute"`
	VirtualService Resource      `yaml:"virtualService"`
}

// HTTPRouteFile names the HTTPRoute whose backendRef weights are rewritten:
// one rule per virtual model, matching its x-infergate-model header, with
// the pools as backendRefs. File is only for httpRouteFile.
type HTTPRouteFile struct {
	File      string `yaml:"file"`
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
}

// Resource names a namespaced Kubernetes object.
type Resource struct {
	Namespace string `yaml:"namespace"`
	Name      string `yaml:"name"`
}

// GatewayExtension makes infergate Envoy Gateway's extension server for
// InferencePool backends, on xds.listen (with xds.tls when set): each
// InferencePool's cluster becomes the ORIGINAL_DST one its Endpoint Picker
// names the pod for, and the picker's ext_proc filter goes between the
// gate and the meter of every listener that routes to the pool (see
// docs/deploy/inference-extension.md).
type GatewayExtension struct {
	Enabled bool `yaml:"enabled"`
	// Policy is the EnvoyExtensionPolicy whose extProc 0 is infergate's
	// gate and extProc 1 its meter: the picker goes right after the gate.
	Policy Resource `yaml:"policy"`
	// ClusterDomain is the cluster's DNS domain: the picker is reached at
	// <endpointPickerRef.name>.<pool namespace>.svc.<clusterDomain>.
	ClusterDomain string `yaml:"clusterDomain"`
	// EndpointPickerTLS connects to the pickers over TLS, without verifying
	// their certificate (the Endpoint Picker serves a self-signed one by
	// default); false connects in plaintext.
	EndpointPickerTLS *bool `yaml:"endpointPickerTLS"`
}

// XDS is the control plane Envoy fetches the virtual-model routes from.
type XDS struct {
	// Listen is host:port; loopback unless TLS or InsecureOpenToNetwork
	// (see ExtProc.Listen).
	Listen          string `yaml:"listen"`
	RouteConfigName string `yaml:"routeConfigName"`
	// TLS serves xDS over TLS to clients whose certificate the CA signed
	// (mTLS): whoever reaches a plaintext xDS port reads every route and
	// weight.
	TLS TLS `yaml:"tls"`
	// InsecureOpenToNetwork lets a non-loopback Listen serve plaintext xDS
	// to anything that reaches it.
	InsecureOpenToNetwork bool `yaml:"insecureOpenToNetwork"`
}

// Auth says how callers are identified. With neither keys nor JWT
// configured every caller is anonymous and authentication is off.
type Auth struct {
	// Keys is a keys file, or a directory of them (a mounted Kubernetes
	// Secret); see internal/identity.KeyFile. Reloaded on change.
	Keys string `yaml:"keys"`
	JWT  JWT    `yaml:"jwt"`
	// PolicyHeaders are the request headers passed to the policy input.
	PolicyHeaders []string `yaml:"policyHeaders"`
}

// JWT reads claims verified by Envoy's jwt_authn filter (payload_in_metadata).
type JWT struct {
	Enabled     bool     `yaml:"enabled"`
	Namespace   string   `yaml:"namespace"`
	PayloadKey  string   `yaml:"payloadKey"`
	TenantClaim string   `yaml:"tenantClaim"`
	LabelClaims []string `yaml:"labelClaims"`
}

// Policy is the Rego policy directory.
type Policy struct {
	// Dir holds *.rego files and data; empty admits every authenticated,
	// well-formed request.
	Dir string `yaml:"dir"`
	// ReloadInterval is how often Dir is checked for changes.
	ReloadInterval time.Duration `yaml:"reloadInterval"`
	// Shadow evaluates and records decisions (decision "shadow_deny") but
	// enforces none: for trying a policy on live traffic.
	Shadow bool `yaml:"shadow"`
	// Memoize reuses a decision for requests that agree on every input
	// field the policy reads (per policy version; never for a policy that
	// calls a non-deterministic built-in such as time.now_ns or http.send).
	Memoize *bool `yaml:"memoize"`
}

// RateLimit chooses where budgets are counted.
type RateLimit struct {
	// Backend is where the money is kept: embedded (a file on this host,
	// surviving restarts: one replica), memory (this process: a restart
	// forgets every budget, seal and spend; for tests and throwaway runs)
	// or redis (shared by replicas).
	Backend  string   `yaml:"backend"`
	Embedded Embedded `yaml:"embedded"`
	Redis    Redis    `yaml:"redis"`
	// OnBackendError: "deny" answers 503 while Redis is unreachable; "local"
	// falls back to this replica's in-memory counters.
	OnBackendError string `yaml:"onBackendError"`
	// DefaultMaxTokens is the effective max_tokens of a completion that sets
	// none (nor max_completion_tokens) when the policy names no cap
	// (infergate.authz.max_tokens): its output reservation is this, times
	// n/best_of. infergate does not know models' context lengths, so this
	// is a configured figure, not a model limit; the request's body is left
	// alone and the settlement charges what the server really wrote. With
	// a cap, the cap is reserved instead and sent upstream as max_tokens.
	DefaultMaxTokens int `yaml:"defaultMaxTokens"`
}

// Embedded is the embedded ledger: one file (bbolt) holding the budget
// counters, the settle-once table and its keys, and the spend hours.
type Embedded struct {
	// Path of the file, created (with its directory, mode 0700/0600) if
	// absent. One process per file: a second one fails at start. Put it on
	// a persistent volume (the chart's one-Deployment mode mounts a
	// PersistentVolumeClaim there).
	Path string `yaml:"path"`
}

// DefaultLedgerPath is where the embedded ledger is kept unless
// ratelimit.embedded.path says otherwise.
const DefaultLedgerPath = "/var/lib/infergate/ledger.db"

// Reservations shape the seals on what the gate hands to the meter
// through Envoy (the reservation, the whole gate→meter field): each is
// settled once, within its expiry, under keys the replicas share (in
// Redis with the redis backend) and rotate.
type Reservations struct {
	// LongestStream: a reservation may be settled until its window ends
	// plus this, a gate field read until it was written plus this; later,
	// the settlement is refused (the reservation stays charged) and the
	// stamp recorded unverified.
	LongestStream time.Duration `yaml:"longestStream"`
	// MaxAge caps any seal's life (a policy's long window included); it
	// bounds the keys kept and the settle-once records' TTL.
	MaxAge time.Duration `yaml:"maxAge"`
	// KeyRotation is how long one key seals; earlier keys verify until
	// their seals expire. KeyRefresh is how often each replica re-reads
	// the keys from Redis (less than KeyRotation).
	KeyRotation time.Duration `yaml:"keyRotation"`
	KeyRefresh  time.Duration `yaml:"keyRefresh"`
	// MaxSettled bounds the seals kept outstanding on this replica, all
	// tenants' (backends memory and embedded: issued, not yet settled or
	// read, nor expired; two per request): the last-resort bound on this
	// process's memory and file, past which new requests are refused 503
	// too_many_requests_in_flight.
	MaxSettled int `yaml:"maxSettled"`
	// MaxSettledPerTenant is each tenant's share of the seals outstanding
	// (memory and Redis; default maxSettled / 16): a tenant that holds it
	// (requests in flight, or lost on the way and not yet expired) has
	// its new requests refused 429 too_many_requests_in_flight, and no
	// other tenant is touched.
	MaxSettledPerTenant int `yaml:"maxSettledPerTenant"`
}

func (r *Reservations) fillDefaults() {
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&r.LongestStream, time.Hour}, {&r.MaxAge, 25 * time.Hour}, {&r.KeyRotation, 24 * time.Hour}, {&r.KeyRefresh, time.Minute}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if r.MaxSettled == 0 {
		r.MaxSettled = 1 << 20
	}
	if r.MaxSettledPerTenant == 0 {
		r.MaxSettledPerTenant = max(r.MaxSettled/16, 1)
	}
}

func (r *Reservations) validate() []error {
	var errs []error
	check := func(ok bool, path, format string, args ...any) {
		if !ok {
			errs = append(errs, &Error{Path: "reservations." + path, Msg: fmt.Sprintf(format, args...)})
		}
	}
	check(r.LongestStream >= time.Minute, "longestStream", "must be at least 1m, got %s", r.LongestStream)
	check(r.MaxAge >= r.LongestStream && r.MaxAge <= 31*24*time.Hour, "maxAge", "must be from longestStream (%s) to 744h, got %s", r.LongestStream, r.MaxAge)
	check(r.KeyRotation >= time.Minute, "keyRotation", "must be at least 1m, got %s", r.KeyRotation)
	check(r.KeyRefresh >= time.Second && r.KeyRefresh < r.KeyRotation, "keyRefresh", "must be from 1s to less than keyRotation (%s), got %s", r.KeyRotation, r.KeyRefresh)
	check(r.KeyRotation >= 0 && r.MaxAge/max(r.KeyRotation, 1) <= 1000, "keyRotation", "keeps over 1000 keys live (maxAge %s / keyRotation %s)", r.MaxAge, r.KeyRotation)
	check(r.MaxSettled > 0 && r.MaxSettled <= 1<<26, "maxSettled", "must be 1 to %d, got %d", 1<<26, r.MaxSettled)
	check(r.MaxSettledPerTenant > 0 && r.MaxSettledPerTenant <= 1<<26, "maxSettledPerTenant", "must be 1 to %d, got %d", 1<<26, r.MaxSettledPerTenant)
	return errs
}

// Redis is what replicas share: the rate-limit counters, the key sealing
// reservations, the observations and the weights in force. One server
// (mode standalone, at address) or a Redis Cluster (mode cluster, found
// through addresses).
type Redis struct {
	// Mode is standalone (the default: one server, or one endpoint in
	// front of a primary, such as a managed service's) or cluster (Redis
	// Cluster: the client follows the slot map, its redirections and
	// failovers).
	Mode string `yaml:"mode"`
	// Address is the standalone server, host:port.
	Address string `yaml:"address"`
	// Addresses are nodes of the cluster to learn its slot map from
	// (host:port each; any of them, more than one in case one is down):
	// mode cluster only.
	Addresses []string `yaml:"addresses"`
	// HashTag is the Redis Cluster hash tag of every rate-limit counter
	// (mode cluster only; default "infergate", see
	// ratelimit.DefaultClusterHashTag). All counters live in its one slot,
	// so one request's limits, whatever keys they count under, are charged
	// by one atomic script: tagging each counter by its own key would
	// spread them over the cluster but fail every request whose limits
	// have different keys (CROSSSLOT). One slot is one primary's load;
	// change the tag to move it to another primary.
	HashTag      string        `yaml:"hashTag"`
	Username     string        `yaml:"username"`
	PasswordFile string        `yaml:"passwordFile"`
	DB           int           `yaml:"db"`
	Timeout      time.Duration `yaml:"timeout"`
}

// Check is an external HTTP check a policy can require (e.g. moderation):
// the request body is POSTed to URL; 2xx admits, 4xx denies.
type Check struct {
	URL     string        `yaml:"url"`
	Timeout time.Duration `yaml:"timeout"`
	// OnError: "deny" (503) or "allow" when the check fails or times out.
	OnError string `yaml:"onError"`
}

// DefaultMaxGateStreamsPerPeer is extproc.maxGateStreamsPerPeer's default.
const DefaultMaxGateStreamsPerPeer = 4096

// DefaultMaxWaitingBodiesPerPrincipal is
// extproc.maxWaitingBodiesPerPrincipal's default.
const DefaultMaxWaitingBodiesPerPrincipal = 256

// DefaultBodyTimeout is gate.bodyTimeout's default.
const DefaultBodyTimeout = 30 * time.Second

// ExtProc is the gRPC ExternalProcessor service Envoy calls.
type ExtProc struct {
	// Listen is host:port, or unix:PATH for a Unix domain socket (Envoy on
	// the same host: its cluster endpoint is then {pipe: {path: PATH}}).
	// A host:port must be a loopback IP (127.0.0.1, [::1]) unless TLS is
	// set or InsecureOpenToNetwork says plaintext on the network is meant:
	// a host name or an unspecified address (":50051", 0.0.0.0, [::]) is
	// not provably loopback.
	Listen string `yaml:"listen"`
	// MaxConcurrentStreams bounds in-flight ext_proc streams per connection
	// (two per HTTP request: gate and meter).
	MaxConcurrentStreams uint32 `yaml:"maxConcurrentStreams"`
	// MaxGateStreamsPerPeer bounds the gate streams one peer (an IP
	// address, over all its connections; a unix: socket is one peer) holds
	// open at once; beyond it a new request is answered 503
	// gate_overloaded, so one hostile peer cannot take the gate from the
	// others. One Envoy is one peer: a gate stream lasts while Envoy reads
	// a request, so the default is far above what a busy gateway keeps in
	// flight. Behind a proxy that hides the peers' addresses (an Istio
	// sidecar in infergate's pod), it bounds them all together.
	MaxGateStreamsPerPeer uint32 `yaml:"maxGateStreamsPerPeer"`
	// MaxWaitingBodiesPerPrincipal bounds the gate streams one API key
	// (or JWT subject), and one tenant, holds between its request headers
	// and its body's end; beyond it that caller's next request is answered
	// 429 too_many_waiting_bodies at its headers, while every other caller
	// is served: a client that holds bodies back (slowly sent, or never)
	// holds its own share, not the gate. A caller the policy names no one
	// (no authentication configured) is bounded by maxGateStreamsPerPeer
	// alone, which stays the backstop.
	MaxWaitingBodiesPerPrincipal uint32 `yaml:"maxWaitingBodiesPerPrincipal"`
	// TLS serves the port over TLS and admits only clients whose
	// certificate the CA signed (mTLS): anything that can reach a plaintext
	// port can forge a meter's stamps or a gate's verified JWT claims.
	TLS TLS `yaml:"tls"`
	// InsecureOpenToNetwork lets a non-loopback Listen serve plaintext:
	// anything that reaches the port can open gate and meter streams. For
	// a network whose only other peer is the gateway (a NetworkPolicy
	// enforced by the CNI, a mesh's mTLS in front of the port).
	InsecureOpenToNetwork bool `yaml:"insecureOpenToNetwork"`
}

// TLS is the ext_proc port's certificate, its key and the CA client
// certificates must chain to: all three or none. The files are reloaded
// when they change (checked every policy.reloadInterval); new handshakes
// get the new ones. A unix: socket takes none: its file permissions, in a
// pod or on a host, are its boundary.
type TLS struct {
	CertFile     string `yaml:"certFile"`
	KeyFile      string `yaml:"keyFile"`
	ClientCAFile string `yaml:"clientCAFile"`
}

// Enabled reports whether the port is served over TLS.
func (t TLS) Enabled() bool { return t != TLS{} }

// missing names the unset files of a partly set TLS section.
func (t TLS) missing() []string {
	var out []string
	for _, f := range []struct{ name, v string }{{"certFile", t.CertFile}, {"keyFile", t.KeyFile}, {"clientCAFile", t.ClientCAFile}} {
		if strings.TrimSpace(f.v) == "" {
			out = append(out, f.name)
		}
	}
	return out
}

// Admin is the HTTP port for /metrics, /healthz, /readyz and the /debug pages.
type Admin struct {
	// Listen is host:port, a loopback IP unless OpenToNetwork.
	Listen string `yaml:"listen"`
	// OpenToNetwork lets a non-loopback Listen serve /metrics, /healthz
	// and /readyz (a scraper and the kubelet reach them over the pod
	// network); the /debug pages then need Debug.TokenFile.
	OpenToNetwork bool `yaml:"openToNetwork"`
	// RecentRequests is how many requests /debug/requests keeps (default
	// 1000; 0: none are kept and the page is off).
	RecentRequests *int `yaml:"recentRequests"`
	// Pprof mounts Go's profiler (net/http/pprof) under /debug/pprof/: for
	// profiling a running gateway. Off by default: the admin port should
	// not hand out profiles unless asked to. Guarded by Debug.TokenFile.
	Pprof bool  `yaml:"pprof"`
	Debug Debug `yaml:"debug"`
}

// Debug turns on /debug/requests (tenants, principals, upstreams, reasons),
// /debug/controller (pools and weights) and, with auth.keys, /debug/keys
// (the loaded keys' ids, expiry and last use; never a key or a hash).
type Debug struct {
	Enabled bool `yaml:"enabled"`
	// TokenFile holds a bearer token every /debug/ request (pprof's too)
	// must present as "Authorization: Bearer TOKEN"; "" = no token
	// (loopback only). Read on every request, so a rotated Secret applies
	// at once.
	TokenFile string `yaml:"tokenFile"`
}

// ServesDebug reports whether anything is served under /debug/.
func (a Admin) ServesDebug() bool { return a.Debug.Enabled || a.Pprof }

// Tracing exports OpenTelemetry spans of every request's phases over OTLP.
// Standard OTEL_EXPORTER_OTLP_* variables (headers, certificates) apply.
type Tracing struct {
	// Endpoint is the OTLP collector, host:port; "" turns tracing off.
	Endpoint string `yaml:"endpoint"`
	// Protocol is grpc (port 4317) or http (http/protobuf, port 4318).
	Protocol string `yaml:"protocol"`
	// Insecure sends without TLS.
	Insecure bool `yaml:"insecure"`
	// SampleRatio samples requests whose trace has no sampling decision
	// yet; a parent's decision (Envoy's, the client's) is always followed.
	SampleRatio float64 `yaml:"sampleRatio"`
	// QueueSize bounds spans waiting for export; beyond it they are
	// dropped (and counted), never waited for.
	QueueSize int `yaml:"queueSize"`
	// TraceURL links a trace id on /debug/requests to your tracing UI,
	// e.g. http://jaeger:16686/trace/{trace_id}.
	TraceURL string `yaml:"traceURL"`
}

// Gate configures the blocking request filter.
type Gate struct {
	// MaxBodyBytes is the largest request body accepted (413 above it). Keep
	// it at or below Envoy's per-connection buffer limit.
	MaxBodyBytes int `yaml:"maxBodyBytes"`
	// BodyTimeout is how long the gate waits for a request's body after
	// its headers: past it the request is answered 408
	// request_body_timeout and its stream ends, in every body mode
	// (Envoy buffering the body included). Envoy's own request timeout
	// (the shipped configs' request_timeout, the chart's
	// requestReceivedTimeout) is set longer, as a backstop.
	BodyTimeout time.Duration `yaml:"bodyTimeout"`
	// InjectUsage sets stream_options.include_usage on streaming requests,
	// so token counts (and charges) come from the model server.
	InjectUsage *bool `yaml:"injectUsage"`
	// HonourUsageOptOut leaves a client's explicit include_usage: false
	// alone (default false: usage is asked for on every stream, so a client
	// cannot lower its charge by opting out).
	HonourUsageOptOut bool `yaml:"honourUsageOptOut"`
	// ChatOutputLimit is the key the gate adds to a chat completion that
	// names no output cap when the policy caps it: max_tokens (default:
	// every OpenAI-compatible server reads it) or max_completion_tokens
	// (OpenAI's reasoning models refuse max_tokens; a server that ignores
	// it would write past the reservation). A cap the client sent is
	// rewritten under the key it used.
	ChatOutputLimit string `yaml:"chatOutputLimit"`
	// Paths are the request paths the gate treats as inference requests
	// (JSON bodies with a model), each read as the API its last segments
	// name (openai.APIOf; a chat or text completion when they name none).
	// Other paths get the policy's answer (404 without a policy).
	Paths []string `yaml:"paths"`
}

// Meter configures the observing response filter.
type Meter struct {
	// MaxEventBytes bounds one SSE line kept across chunks.
	MaxEventBytes int `yaml:"maxEventBytes"`
	// MaxTrackedGaps bounds the inter-token gaps kept per request for
	// percentiles; later gaps still count toward max and metrics.
	MaxTrackedGaps int `yaml:"maxTrackedGaps"`
	// Wasm serves the in-Envoy meter's summaries (envoy/wasm-meter.yaml:
	// Envoy's gRPC access log) on the ext_proc port. Off, the access-log
	// service is not registered: nothing can send summaries.
	Wasm bool `yaml:"wasm"`
}

// Log configures the process logger.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // json or text
	// Requests writes one JSON line per request (the stamp).
	Requests *bool `yaml:"requests"`
}

// Error is a configuration problem, located at a line when it is known.
type Error struct {
	Line int
	Path string // dotted key, e.g. gate.maxBodyBytes
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s: %s", e.Line, e.Path, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.Path, e.Msg)
}

// Load reads a config file; an empty path means the embedded default.
func Load(path string) (*Config, error) {
	if path == "" {
		return Parse(Default)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Parse decodes, defaults and validates a YAML document. Unknown keys and
// wrong types are errors, reported with their line.
func Parse(b []byte) (*Config, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	c := &Config{}
	if root.Kind != 0 {
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
			return nil, tidyYAMLError(err, &root)
		}
	}
	c.fillDefaults()
	if err := c.validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.Line = lineOf(&root, ce.Path)
		}
		return nil, err
	}
	return c, nil
}

func (c *Config) fillDefaults() {
	setDefault(&c.ExtProc.Listen, "127.0.0.1:50051")
	if c.ExtProc.MaxConcurrentStreams == 0 {
		c.ExtProc.MaxConcurrentStreams = 10000
	}
	if c.ExtProc.MaxGateStreamsPerPeer == 0 {
		c.ExtProc.MaxGateStreamsPerPeer = DefaultMaxGateStreamsPerPeer
	}
	if c.ExtProc.MaxWaitingBodiesPerPrincipal == 0 {
		c.ExtProc.MaxWaitingBodiesPerPrincipal = DefaultMaxWaitingBodiesPerPrincipal
	}
	if c.Gate.BodyTimeout == 0 {
		c.Gate.BodyTimeout = DefaultBodyTimeout
	}
	setDefault(&c.Admin.Listen, "127.0.0.1:9090")
	if c.Admin.RecentRequests == nil {
		c.Admin.RecentRequests = ptr(1000)
	}
	setDefault(&c.WeightSink.Type, "xds")
	setDefault(&c.GatewayExtension.ClusterDomain, "cluster.local")
	if c.GatewayExtension.EndpointPickerTLS == nil {
		c.GatewayExtension.EndpointPickerTLS = ptr(true)
	}
	setDefault(&c.Tracing.Protocol, "grpc")
	if c.Tracing.SampleRatio == 0 {
		c.Tracing.SampleRatio = 1
	}
	if c.Tracing.QueueSize == 0 {
		c.Tracing.QueueSize = 4096
	}
	if c.Gate.MaxBodyBytes == 0 {
		c.Gate.MaxBodyBytes = 1 << 20
	}
	if c.Gate.InjectUsage == nil {
		c.Gate.InjectUsage = ptr(true)
	}
	setDefault(&c.Gate.ChatOutputLimit, "max_tokens")
	if c.Gate.Paths == nil {
		c.Gate.Paths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"}
	}
	if c.Meter.MaxEventBytes == 0 {
		c.Meter.MaxEventBytes = 1 << 20
	}
	if c.Meter.MaxTrackedGaps == 0 {
		c.Meter.MaxTrackedGaps = 16384
	}
	setDefault(&c.Auth.JWT.Namespace, "envoy.filters.http.jwt_authn")
	setDefault(&c.Auth.JWT.PayloadKey, "jwt_payload")
	setDefault(&c.Auth.JWT.TenantClaim, "tenant")
	if c.Auth.JWT.LabelClaims == nil {
		c.Auth.JWT.LabelClaims = []string{"tier"}
	}
	if c.Auth.PolicyHeaders == nil {
		c.Auth.PolicyHeaders = []string{"user-agent", "x-request-id"}
	}
	if c.Policy.ReloadInterval == 0 {
		c.Policy.ReloadInterval = time.Second
	}
	if c.Policy.Memoize == nil {
		c.Policy.Memoize = ptr(true)
	}
	setDefault(&c.RateLimit.Backend, "embedded")
	setDefault(&c.RateLimit.Embedded.Path, DefaultLedgerPath)
	setDefault(&c.RateLimit.OnBackendError, "deny")
	if c.RateLimit.DefaultMaxTokens == 0 {
		c.RateLimit.DefaultMaxTokens = 1024
	}
	c.Reservations.fillDefaults()
	setDefault(&c.RateLimit.Redis.Mode, "standalone")
	if c.RateLimit.Redis.Addresses == nil {
		c.RateLimit.Redis.Addresses = []string{}
	}
	if c.RateLimit.Redis.Timeout == 0 {
		c.RateLimit.Redis.Timeout = 250 * time.Millisecond
	}
	if c.Checks == nil {
		c.Checks = map[string]Check{}
	}
	for name, ch := range c.Checks {
		if ch.Timeout == 0 {
			ch.Timeout = 500 * time.Millisecond
		}
		setDefault(&ch.OnError, "deny")
		c.Checks[name] = ch
	}
	if c.Models == nil {
		c.Models = []string{}
	}
	if c.VirtualModels == nil {
		c.VirtualModels = []VirtualModel{}
	}
	if c.PoolModels.Pools == nil {
		c.PoolModels.Pools = []ModelsPool{}
	}
	if c.PoolModels.Interval == 0 {
		c.PoolModels.Interval = 30 * time.Second
	}
	if c.PoolModels.KeepFor == 0 {
		c.PoolModels.KeepFor = 5 * time.Minute
	}
	if c.PoolModels.Timeout == 0 {
		c.PoolModels.Timeout = 5 * time.Second
	}
	setDefault(&c.XDS.Listen, "127.0.0.1:18000")
	setDefault(&c.XDS.RouteConfigName, "infergate")
	setDefault(&c.Log.Level, "info")
	setDefault(&c.Log.Format, "json")
	setDefault(&c.Prices.Currency, "USD")
	if c.Prices.Models == nil {
		c.Prices.Models = map[string]ModelPrice{}
	}
	if c.Log.Requests == nil {
		c.Log.Requests = ptr(true)
	}
}

// Validate checks c again, e.g. after command-line flags changed its
// listen addresses.
func (c *Config) Validate() error { return c.validate() }

func (c *Config) validate() error {
	var errs []error
	check := func(ok bool, path, format string, args ...any) {
		if !ok {
			errs = append(errs, &Error{Path: path, Msg: fmt.Sprintf(format, args...)})
		}
	}
	check(validAddr(c.ExtProc.Listen) || validUnix(c.ExtProc.Listen), "extproc.listen", "%q is not host:port or unix:PATH", c.ExtProc.Listen)
	if tls := c.ExtProc.TLS; tls.Enabled() {
		missing := tls.missing()
		check(len(missing) == 0, "extproc.tls", "certFile, keyFile and clientCAFile go together (client certificates are required); missing %s",
			strings.Join(missing, ", "))
		check(!validUnix(c.ExtProc.Listen), "extproc.tls", "not used on a unix: socket (its file permissions are its boundary); listen on host:port or drop tls")
	}
	if !validUnix(c.ExtProc.Listen) && validAddr(c.ExtProc.Listen) {
		errs = append(errs, exposed("extproc", c.ExtProc.Listen, c.ExtProc.TLS.Enabled() || c.ExtProc.InsecureOpenToNetwork,
			"anything that reaches it could open gate and meter streams (forged stamps, forged JWT claims)")...)
	}
	check(validAddr(c.Admin.Listen), "admin.listen", "%q is not host:port", c.Admin.Listen)
	if validAddr(c.Admin.Listen) && !Loopback(c.Admin.Listen) {
		check(c.Admin.OpenToNetwork, "admin.listen", "%q is not a loopback address: set admin.openToNetwork: true to serve /metrics, /healthz and /readyz "+
			"beyond loopback, or listen on 127.0.0.1:PORT", c.Admin.Listen)
		check(!c.Admin.ServesDebug() || strings.TrimSpace(c.Admin.Debug.TokenFile) != "", "admin.debug.tokenFile",
			"is required for the /debug pages (admin.debug.enabled, admin.pprof) on %q, beyond loopback", c.Admin.Listen)
	}
	check(c.Gate.MaxBodyBytes > 0 && c.Gate.MaxBodyBytes <= 64<<20, "gate.maxBodyBytes",
		"must be between 1 and 67108864, got %d", c.Gate.MaxBodyBytes)
	check(c.Gate.BodyTimeout > 0 && c.Gate.BodyTimeout <= 10*time.Minute, "gate.bodyTimeout",
		"must be more than 0 and at most 10m, got %s", c.Gate.BodyTimeout)
	check(oneOf(c.Gate.ChatOutputLimit, "max_tokens", "max_completion_tokens"), "gate.chatOutputLimit",
		"must be max_tokens or max_completion_tokens; got %q", c.Gate.ChatOutputLimit)
	for _, p := range c.Gate.Paths {
		check(strings.HasPrefix(p, "/"), "gate.paths", "%q must start with /", p)
	}
	check(c.Meter.MaxEventBytes >= 1024, "meter.maxEventBytes", "must be at least 1024, got %d", c.Meter.MaxEventBytes)
	check(c.Meter.MaxTrackedGaps > 0, "meter.maxTrackedGaps", "must be positive, got %d", c.Meter.MaxTrackedGaps)
	check(oneOf(c.RateLimit.Backend, "embedded", "memory", "redis"), "ratelimit.backend", "must be embedded, memory or redis; got %q", c.RateLimit.Backend)
	errs = append(errs, c.RateLimit.validateRedis()...)
	check(oneOf(c.RateLimit.OnBackendError, "deny", "local"), "ratelimit.onBackendError", "must be deny or local; got %q", c.RateLimit.OnBackendError)
	check(c.RateLimit.DefaultMaxTokens > 0 && c.RateLimit.DefaultMaxTokens <= math.MaxInt32, "ratelimit.defaultMaxTokens",
		"must be between 1 and %d, got %d", math.MaxInt32, c.RateLimit.DefaultMaxTokens)
	check(c.RateLimit.Redis.Timeout > 0, "ratelimit.redis.timeout", "must be positive")
	errs = append(errs, c.Reservations.validate()...)
	errs = append(errs, c.Prices.validate()...)
	errs = append(errs, c.unknownPricedModels()...)
	check(c.Policy.ReloadInterval >= 100*time.Millisecond, "policy.reloadInterval", "must be at least 100ms, got %s", c.Policy.ReloadInterval)
	for name, ch := range c.Checks {
		u, err := url.Parse(ch.URL)
		check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", "checks", "%s: url %q must be http(s)://host/...", name, ch.URL)
		check(ch.Timeout > 0, "checks", "%s: timeout must be positive", name)
		check(oneOf(ch.OnError, "deny", "allow"), "checks", "%s: onError must be deny or allow; got %q", name, ch.OnError)
	}
	check(validAddr(c.XDS.Listen), "xds.listen", "%q is not host:port", c.XDS.Listen)
	if tls := c.XDS.TLS; tls.Enabled() {
		missing := tls.missing()
		check(len(missing) == 0, "xds.tls", "certFile, keyFile and clientCAFile go together (client certificates are required); missing %s",
			strings.Join(missing, ", "))
	}
	if validAddr(c.XDS.Listen) {
		errs = append(errs, exposed("xds", c.XDS.Listen, c.XDS.TLS.Enabled() || c.XDS.InsecureOpenToNetwork,
			"anything that reaches it reads every route and pool weight")...)
	}
	check(*c.Admin.RecentRequests >= 0 && *c.Admin.RecentRequests <= 100_000, "admin.recentRequests", "must be 0 to 100000, got %d", *c.Admin.RecentRequests)
	check(oneOf(c.WeightSink.Type, "xds", "httpRouteFile", "httpRoute", "virtualService"), "weightSink.type",
		"must be xds, httpRouteFile, httpRoute or virtualService; got %q", c.WeightSink.Type)
	switch ws := c.WeightSink; ws.Type {
	case "httpRouteFile":
		check(ws.HTTPRoute.File != "" && ws.HTTPRoute.Name != "", "weightSink.httpRoute", "file and name are required with type httpRouteFile")
	case "httpRoute":
		check(ws.HTTPRoute.Namespace != "" && ws.HTTPRoute.Name != "", "weightSink.httpRoute", "namespace and name are required with type httpRoute")
	case "virtualService":
		check(ws.VirtualService.Namespace != "" && ws.VirtualService.Name != "", "weightSink.virtualService", "namespace and name are required with type virtualService")
	}
	if ge := c.GatewayExtension; ge.Enabled {
		check(len(validation.IsDNS1123Label(ge.Policy.Namespace)) == 0, "gatewayExtension.policy.namespace",
			"%q is not a Kubernetes namespace (a DNS-1123 label)", ge.Policy.Namespace)
		check(len(validation.IsDNS1123Subdomain(ge.Policy.Name)) == 0, "gatewayExtension.policy.name",
			"%q is not a Kubernetes object name (a DNS-1123 subdomain)", ge.Policy.Name)
		check(len(validation.IsDNS1123Subdomain(ge.ClusterDomain)) == 0, "gatewayExtension.clusterDomain",
			"%q is not a DNS domain (a DNS-1123 subdomain)", ge.ClusterDomain)
	}
	check(c.Tracing.Endpoint == "" || validAddr(c.Tracing.Endpoint), "tracing.endpoint", "%q is not host:port", c.Tracing.Endpoint)
	check(oneOf(c.Tracing.Protocol, "grpc", "http"), "tracing.protocol", "must be grpc or http; got %q", c.Tracing.Protocol)
	check(c.Tracing.SampleRatio > 0 && c.Tracing.SampleRatio <= 1, "tracing.sampleRatio", "must be in (0, 1], got %v", c.Tracing.SampleRatio)
	check(c.Tracing.QueueSize > 0, "tracing.queueSize", "must be positive")
	names := map[string]bool{}
	for i, m := range c.Models {
		at := fmt.Sprintf("models.%d", i)
		check(strings.TrimSpace(m) != "" && len(m) <= maxModelName, at, "must be 1 to %d bytes, got %q", maxModelName, m)
		check(!names[m], at, "%q is listed twice", m)
		names[m] = true
	}
	for i, vm := range c.VirtualModels {
		at := fmt.Sprintf("virtualModels.%d", i)
		check(strings.TrimSpace(vm.Name) != "", at+".name", "is required")
		check(!names[vm.Name], at+".name", "%q is defined twice (in models or virtualModels)", vm.Name)
		names[vm.Name] = true
		check(len(vm.Pools) > 0, at+".pools", "at least one pool is required")
		clusters := map[string]bool{}
		for j, p := range vm.Pools {
			check(p.Cluster != "", fmt.Sprintf("%s.pools.%d.cluster", at, j), "is required")
			check(!clusters[p.Cluster], fmt.Sprintf("%s.pools.%d.cluster", at, j), "%q is listed twice", p.Cluster)
			clusters[p.Cluster] = true
			check(p.Priority >= 0, fmt.Sprintf("%s.pools.%d.priority", at, j), "must be 0 (primary) or more, got %d", p.Priority)
			if p.EndpointPicker != "" {
				field := fmt.Sprintf("%s.pools.%d.endpointPicker", at, j)
				check(filterName.MatchString(p.EndpointPicker), field, "%q is not an Envoy filter name (letters, digits, . _ -; at most 128)", p.EndpointPicker)
				check(c.WeightSink.Type == "xds", field, "needs weightSink.type xds (infergate's routes turn the picker off for the other pools)")
				check(!vm.RetriesAcrossPools(), field, "not with retries across pools (retry.acrossPools: false): the pool's cluster is the picker's ORIGINAL_DST one")
			}
			for _, m := range p.Metrics {
				u, err := url.Parse(m)
				check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "",
					fmt.Sprintf("%s.pools.%d.metrics", at, j), "%q must be an http(s) URL", m)
			}
			if ip := p.InferencePool; ip != nil {
				field := fmt.Sprintf("%s.pools.%d.inferencePool", at, j)
				check(len(p.Metrics) == 0, field, "not with metrics: the pool's pods are its metrics")
				check(dnsLabel.MatchString(ip.Namespace), field+".namespace", "%q is not a namespace name", ip.Namespace)
				check(dnsLabel.MatchString(ip.Name), field+".name", "%q is not an InferencePool name (a DNS label)", ip.Name)
				u, err := url.Parse(ip.MetricsPath)
				check(ip.MetricsPath == "" || err == nil && strings.HasPrefix(ip.MetricsPath, "/") && u.Path == ip.MetricsPath && len(ip.MetricsPath) <= 256,
					field+".metricsPath", "%q is not a URL path (e.g. /metrics)", ip.MetricsPath)
			}
		}
		// The controller owns the bounds of the SLA and the tuning.
		for _, fe := range controller.FieldErrors(vm.SLA.Validate()) {
			check(false, at+".sla."+fe.Field, "%s", fe.Msg)
		}
		if vm.SLA.QueueDepth > 0 {
			scraped := false
			for _, p := range vm.Pools {
				scraped = scraped || len(p.Metrics) > 0 || p.InferencePool != nil
			}
			check(scraped, at+".sla.queueDepth", "needs pools[].metrics or pools[].inferencePool to read the queue from")
		}
		for _, fe := range controller.FieldErrors(vm.Tuning.Validate()) {
			check(false, at+".tuning."+fe.Field, "%s", fe.Msg)
		}
		// NoProbe is for Go callers; the file has no way to spell it.
		check(vm.Tuning.ProbeWeight != controller.NoProbe, at+".tuning.probeWeight",
			"must be at most %d, got %d", controller.MaxProbeWeight, vm.Tuning.ProbeWeight)
		if vm.Retry != nil {
			check(vm.Retry.Attempts >= 1 && vm.Retry.Attempts <= 10, at+".retry.attempts", "must be 1 to 10, got %d", vm.Retry.Attempts)
			for _, code := range vm.Retry.StatusCodes {
				check(code >= 400 && code <= 599, at+".retry.statusCodes", "%d is not an HTTP error status", code)
			}
		}
	}
	pm := c.PoolModels
	check(len(pm.Pools) == 0 || len(c.Catalog()) == 0, "poolModels.pools",
		"not with models or virtualModels: the gate lists those; drop one or the other")
	check(len(pm.Pools) <= maxModelsPools, "poolModels.pools", "at most %d pools, got %d", maxModelsPools, len(pm.Pools))
	poolNames := map[string]bool{}
	for i, p := range pm.Pools {
		at := fmt.Sprintf("poolModels.pools.%d", i)
		check(strings.TrimSpace(p.Name) != "" && len(p.Name) <= maxModelName, at+".name", "must be 1 to %d bytes, got %q", maxModelName, p.Name)
		check(!poolNames[p.Name], at+".name", "%q is listed twice", p.Name)
		poolNames[p.Name] = true
		u, err := url.Parse(p.URL)
		shown := p.URL
		if err == nil {
			shown = u.Redacted()
		}
		check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil, at+".url",
			"%q must be an http(s) URL without credentials (the pool's GET /v1/models; a key goes in apiKeyFile)", shown)
	}
	check(pm.Interval >= time.Second && pm.Interval <= time.Hour, "poolModels.interval", "must be 1s to 1h, got %s", pm.Interval)
	check(pm.Timeout > 0 && pm.Timeout <= pm.Interval, "poolModels.timeout", "must be more than 0 and at most the interval (%s), got %s", pm.Interval, pm.Timeout)
	check(pm.KeepFor >= pm.Interval, "poolModels.keepFor", "must be at least the interval (%s), got %s", pm.Interval, pm.KeepFor)
	check(oneOf(c.Log.Level, "debug", "info", "warn", "error"), "log.level",
		"must be one of debug, info, warn, error; got %q", c.Log.Level)
	check(oneOf(c.Log.Format, "json", "text"), "log.format", "must be json or text; got %q", c.Log.Format)
	if len(errs) > 0 {
		return errs[0] // the first, with its line; fix and re-run
	}
	return nil
}

// maxModelName bounds a model name: the gate refuses longer ones
// (extproc.MaxModelBytes).
const maxModelName = 256

// maxHashTag bounds ratelimit.redis.hashTag: it is part of every counter
// id.
const maxHashTag = 64

// validateRedis checks ratelimit.redis: the mode, and the addresses it
// takes when the backend is redis.
func (rl *RateLimit) validateRedis() []error {
	var errs []error
	check := func(ok bool, path, format string, args ...any) {
		if !ok {
			errs = append(errs, &Error{Path: path, Msg: fmt.Sprintf(format, args...)})
		}
	}
	r := &rl.Redis
	check(oneOf(r.Mode, "standalone", "cluster"), "ratelimit.redis.mode", "must be standalone or cluster; got %q", r.Mode)
	if rl.Backend == "redis" {
		switch r.Mode {
		case "standalone":
			check(validAddr(r.Address), "ratelimit.redis.address", "must be host:port when the backend is redis; got %q", r.Address)
			check(len(r.Addresses) == 0, "ratelimit.redis.addresses", "is for mode: cluster; a standalone Redis is one address")
		case "cluster":
			check(r.Address == "", "ratelimit.redis.address", "mode: cluster takes addresses (nodes to learn the cluster from), not address")
			check(len(r.Addresses) > 0, "ratelimit.redis.addresses", "at least one host:port is required with mode: cluster")
			seen := map[string]bool{}
			for i, a := range r.Addresses {
				at := fmt.Sprintf("ratelimit.redis.addresses.%d", i)
				check(validAddr(a), at, "%q is not host:port", a)
				check(!seen[a], at, "%q is listed twice", a)
				seen[a] = true
			}
			check(r.DB == 0, "ratelimit.redis.db", "must be 0 with mode: cluster (a Redis Cluster has database 0 only); got %d", r.DB)
		}
	}
	check(r.HashTag == "" || r.Mode == "cluster", "ratelimit.redis.hashTag", "is for mode: cluster (a standalone Redis has no slots)")
	check(!strings.ContainsAny(r.HashTag, "{}"), "ratelimit.redis.hashTag", "must not contain { or }: it is written between braces; got %q", r.HashTag)
	check(len(r.HashTag) <= maxHashTag, "ratelimit.redis.hashTag", "must be at most %d bytes, got %d", maxHashTag, len(r.HashTag))
	return errs
}

// lineOf finds the line of a dotted key path in the document, or 0.
func lineOf(root *yaml.Node, path string) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, key := range strings.Split(path, ".") {
		if i, err := strconv.Atoi(key); err == nil && n.Kind == yaml.SequenceNode {
			if i >= len(n.Content) {
				return line
			}
			n, line = n.Content[i], n.Content[i].Line
			continue
		}
		if n.Kind != yaml.MappingNode {
			return line
		}
		found := false
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				line, n, found = n.Content[i].Line, n.Content[i+1], true
				break
			}
		}
		if !found {
			return line
		}
	}
	return line
}

// exposed refuses a listener of section that reaches beyond loopback
// unless allowed (its mTLS, or the explicit opt-in); risk says what a peer
// could do.
func exposed(section, addr string, allowed bool, risk string) []error {
	if allowed || Loopback(addr) {
		return nil
	}
	alternative := ""
	if section == "extproc" {
		alternative = " (or a unix: socket)"
	}
	return []error{&Error{Path: section + ".listen", Msg: fmt.Sprintf("%q is not a loopback address and the port is plaintext: %s. "+
		"Listen on 127.0.0.1:PORT%s, require client certificates with %s.tls, or accept the risk with %s.insecureOpenToNetwork: true",
		addr, risk, alternative, section, section)}}
}

// Loopback reports whether a host:port binds loopback only: its host is an
// IP literal in 127.0.0.0/8 or ::1. A host name is not provably loopback
// (what it resolves to can change), nor an empty or unspecified host.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

func validAddr(a string) bool {
	_, port, err := net.SplitHostPort(a)
	return err == nil && port != ""
}

// UnixPrefix marks a listen address that is a Unix domain socket path.
const UnixPrefix = "unix:"

func validUnix(a string) bool {
	path, ok := strings.CutPrefix(a, UnixPrefix)
	return ok && strings.TrimSpace(path) != ""
}

func oneOf(v string, options ...string) bool {
	for _, o := range options {
		if v == o {
			return true
		}
	}
	return false
}

func setDefault(s *string, v string) {
	if *s == "" {
		*s = v
	}
}

func ptr[T any](v T) *T { return &v }
