package compose

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/infergate/infergate/internal/admission"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/gate"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/ledgerfile"
	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/seal"
	"github.com/infergate/infergate/internal/spend"
	"github.com/infergate/infergate/internal/telemetry"
	"github.com/infergate/infergate/internal/watch"
)

// Admission are the gate's policy and what it holds open.
type Admission struct {
	Controller *admission.Controller
	policy     *policy.Watcher
	keysErr    atomic.Pointer[error]
	keysFailed atomic.Int64 // refused reloads of the key file
	// redis is a *redis.Client, or a *redis.ClusterClient (mode: cluster).
	Redis redis.UniversalClient
	// ledger is the embedded ledger's open file (backend embedded).
	ledger *ledgerfile.DB
	// spend is the spend ledger, where the budgets are counted.
	Spend *spend.Ledger
	// watchKeys polls the API key file until its context is done (nil
	// without one).
	watchKeys func(context.Context)
	// seals are the keys sealing reservations and gate fields, re-read
	// from the store until run's context is done; fields seals the
	// gate→meter field with them (extproc.Options.Sealer).
	seals  *seal.Keyring
	Fields seal.Fields
}

// NewAdmission loads keys and policies and connects the limiter; run
// watches them for changes.
// clock reads the budget windows (nil: time.Now).
func NewAdmission(ctx context.Context, cfg *config.Config, log *slog.Logger, m *telemetry.Metrics, clock ratelimit.Clock) (*Admission, error) {
	am, err := admission.NewMetrics(m.Meter())
	if err != nil {
		return nil, err
	}
	p := &Admission{Controller: &admission.Controller{
		JWT:     admission.JWT(cfg.Auth.JWT), // the same fields: a conversion that stops compiling when they part
		Shadow:  cfg.Policy.Shadow,
		Headers: cfg.Auth.PolicyHeaders,
		Log:     log,
		Metrics: am,
		Checks:  map[string]*admission.Check{},
	}}
	c := p.Controller
	if extra := gate.UnforwardedHeaders(cfg.Auth.PolicyHeaders); len(extra) > 0 {
		// Envoy sends the gate only the headers its forward_rules name.
		log.Warn("auth.policyHeaders names headers the shipped gate filter does not forward: add them to its "+
			"forward_rules.allowed_headers (the Helm chart does), or no policy sees them", "headers", extra)
	}
	c.DefaultMaxTokens = cfg.RateLimit.DefaultMaxTokens
	c.Prices = cfg.Prices.Table() // money limits reserve and settle at the prices the meter stamps
	if cfg.Auth.Keys != "" {
		last, _ := watch.Fingerprint(cfg.Auth.Keys, nil) // before loading: a change meanwhile is seen
		keys, err := identity.LoadKeys(cfg.Auth.Keys)
		if err != nil {
			return nil, fmt.Errorf("auth.keys: %w", err)
		}
		c.Keys = &identity.KeySet{}
		c.Keys.Store(keys)
		log.Info("API keys loaded", "path", cfg.Auth.Keys, "keys", keys.Len())
		p.watchKeys = func(ctx context.Context) {
			watch.Poll(ctx, cfg.Auth.Keys, nil, last, cfg.Policy.ReloadInterval, func() error {
				keys, err := identity.LoadKeys(cfg.Auth.Keys)
				if err != nil {
					return err
				}
				c.Keys.Store(keys)
				p.keysErr.Store(nil)
				log.Info("API keys reloaded", "keys", keys.Len())
				return nil
			}, func(err error) {
				err = fmt.Errorf("auth.keys reload kept the previous keys: %w", err)
				p.keysErr.Store(&err)
				p.keysFailed.Add(1)
				log.Error("API keys reload failed", "err", err)
			})
		}
	}
	if cfg.Policy.Dir != "" {
		w, err := policy.NewWatcher(ctx, cfg.Policy.Dir, cfg.Policy.ReloadInterval, log, policy.WithMemo(*cfg.Policy.Memoize))
		if err != nil {
			return nil, fmt.Errorf("policy.dir: %w", err)
		}
		p.policy, c.Policy = w, w
		if _, err := m.Meter().Int64ObservableCounter("infergate.policy.decisions",
			metric.WithDescription("Policy decisions by how they were made: evaluated, or reused from an identical input (policy.memoize)."),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				hits, misses := w.MemoStats()
				o.Observe(int64(hits), memoHit)
				o.Observe(int64(misses), memoMiss)
				return nil
			})); err != nil {
			return nil, err
		}
	}
	for name, ch := range cfg.Checks {
		c.Checks[name] = admission.NewCheck(admission.Check{Name: name, URL: ch.URL, Timeout: ch.Timeout, Allow: ch.OnError == "allow", Log: log})
	}
	if clock == nil {
		clock = time.Now
	}
	switch cfg.RateLimit.Backend {
	case "memory":
		c.Limiter = ratelimit.NewMemory(clock)
		log.Warn("budgets, seals and spend are kept in this process's memory (ratelimit.backend: memory): a restart forgets them; " +
			"use embedded (one replica) or redis (replicas) to keep them")
	case "embedded":
		path := cfg.RateLimit.Embedded.Path
		if p.ledger, err = ledgerfile.Open(path); err != nil {
			return nil, fmt.Errorf("ratelimit.embedded.path: %w (set ratelimit.embedded.path to a writable file on a persistent volume, "+
				"or ratelimit.backend: memory for a throwaway run)", err)
		}
		if c.Limiter, err = ratelimit.NewEmbedded(p.ledger, clock, ratelimit.EmbeddedOptions{}); err != nil {
			p.ledger.Close()
			return nil, err
		}
		log.Info("budgets, seals and spend are kept in the embedded ledger", "path", path)
	case "redis":
		if p.Redis, err = RedisClient(cfg.RateLimit.Redis); err != nil {
			return nil, err
		}
		log.Info("budgets, seals and spend are kept in Redis; their durability is Redis' own (appendonly, see docs/reliability.md)")
		mode := ratelimit.FailClosed
		if cfg.RateLimit.OnBackendError == "local" {
			mode = ratelimit.FailLocal
		}
		c.Limiter = ratelimit.WithFallback(ratelimit.NewRedis(p.Redis, clock, ratelimit.RedisOptions{HashTag: cfg.RateLimit.Redis.HashTag}), mode,
			ratelimit.NewMemory(clock), func(err error) { log.Error("rate limit backend error", "err", err) })
	}
	p.Spend = newSpend(cfg, p.Redis, p.ledger, c.Keys, log, clock)
	c.Spend = p.Spend
	if p.seals, c.Settled, err = newSeals(ctx, cfg, p.Redis, p.ledger, log, time.Now); err != nil {
		p.Close()
		return nil, err
	}
	c.Seals, c.LongestStream = p.seals, cfg.Reservations.LongestStream
	p.Fields = seal.Fields{Ring: p.seals, Once: c.Settled, Longest: cfg.Reservations.LongestStream}
	if _, err := m.Meter().Int64ObservableCounter("infergate.reservation.key_mismatch",
		metric.WithDescription("Seals naming a key this replica does not hold (cause unknown_key: replicas disagree on the keys, or a forgery), "+
			"and keys found replaced in Redis (cause replaced: lost, e.g. a FLUSHALL, and created again)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(p.seals.UnknownKeys(), mismatchUnknown)
			o.Observe(p.seals.Changed(), mismatchReplaced)
			return nil
		})); err != nil {
		return nil, err
	}
	if _, err := m.Meter().Int64ObservableCounter("infergate.reload.errors",
		metric.WithDescription(ReloadErrorsHelp),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			if p.policy != nil {
				_, failed := p.policy.Reloads()
				o.Observe(failed, reloadPolicy)
			}
			if p.watchKeys != nil {
				o.Observe(p.keysFailed.Load(), reloadKeys)
			}
			o.Observe(p.seals.Failed(), reloadSeals)
			return nil
		})); err != nil {
		return nil, err
	}
	return p, nil
}

// ReloadErrorsHelp describes infergate.reload.errors, counted by serve too (the ext_proc and xDS certificates).
const ReloadErrorsHelp = "Reloads refused (the last good version keeps serving), by source: policy, keys, reservation_keys or extproc_tls."

var (
	reloadPolicy = metric.WithAttributes(attribute.String("source", "policy"))
	reloadKeys   = metric.WithAttributes(attribute.String("source", "keys"))
	memoHit      = metric.WithAttributes(attribute.String("source", "memo"))
	memoMiss     = metric.WithAttributes(attribute.String("source", "evaluated"))
)

var (
	reloadSeals      = metric.WithAttributes(attribute.String("source", "reservation_keys"))
	mismatchUnknown  = metric.WithAttributes(attribute.String("cause", "unknown_key"))
	mismatchReplaced = metric.WithAttributes(attribute.String("cause", "replaced"))
)

// redisClient connects to the shared Redis (rate limits, the reservation
// key, observations, weights): one server (mode standalone) or a Redis
// Cluster (mode cluster), which every user takes as a
// redis.UniversalClient.
func RedisClient(r config.Redis) (redis.UniversalClient, error) {
	return redisClientWith(r, clusterStateReload, nil)
}

// redisDialer opens a connection to a Redis node.
type redisDialer func(ctx context.Context, network, addr string) (net.Conn, error)

// redisClientWith is redisClient with a cluster client's periodic slot-map
// reload every reload, and dial (nil: go-redis' own) for connections.
func redisClientWith(r config.Redis, reload time.Duration, dial redisDialer) (redis.UniversalClient, error) {
	var password string
	if r.PasswordFile != "" {
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("ratelimit.redis.passwordFile: %w", err)
		}
		password = strings.TrimSpace(string(b))
	}
	if r.Mode == "cluster" {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: r.Addresses, Username: r.Username, Password: password,
			DialTimeout: r.Timeout, ReadTimeout: r.Timeout, WriteTimeout: r.Timeout,
			// One dial per attempt (the default is five): a dead node
			// costs one timeout per attempt, and there are MaxRedirects
			// (3) more attempts on other nodes.
			DialerRetries: 1,
			// A backstop: failovers are followed as their errors show up
			// (followFailovers) or as nodes answer MOVED.
			ClusterStateReloadInterval: reload,
			Dialer:                     dial,
		})
		followFailovers(c)
		sendScriptsOnce(c)
		return c, nil
	}
	// No retries: a budget script Redis ran but whose answer was lost (EOF,
	// a read timeout) would run again, and a settlement applied twice
	// refunds twice. A failed call errs on the accounting rule's side (the
	// reservation stays); dials are still retried, as nothing was sent.
	return redis.NewClient(&redis.Options{Addr: r.Address, Username: r.Username, Password: password, DB: r.DB,
		DialTimeout: r.Timeout, ReadTimeout: r.Timeout, WriteTimeout: r.Timeout, MaxRetries: -1, DialerRetries: 2, Dialer: dial}), nil
}

// clusterStateReload is how stale a cluster client's slot map may get
// when nothing tells it of a change.
const clusterStateReload = 10 * time.Second

// followFailovers makes c reload its slot map as soon as a node fails to
// answer (a network error or timeout) or says the cluster is down. go-redis
// reloads on MOVED and ASK answers only, which a dead primary never sends:
// without this, every command for its slots would keep going to its
// address, and failing, until the periodic reload, long after its replica
// took over. Reloads are coalesced (at most one at a time, then 200 ms
// apart), so a dead node costs one CLUSTER SLOTS per burst of errors.
func followFailovers(c *redis.ClusterClient) {
	hook := reloadOnFailure{reload: func() { c.ReloadState(context.Background()) }}
	c.OnNewNode(func(node *redis.Client) { node.AddHook(hook) })
}

// reloadOnFailure is a hook on every node client of a cluster client.
type reloadOnFailure struct{ reload func() }

func (h reloadOnFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(err)
		return err
	}
}

func (h reloadOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.check(err)
		return err
	}
}

// check reloads after an error that may mean the slot map changed: not an
// answer of Redis (a missing key, a script's error), nor a cancellation by
// the caller, but a node that could not be reached or timed out, or one
// that says the cluster is down or its slots are moving.
func (h reloadOnFailure) check(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		if !strings.HasPrefix(msg, "CLUSTERDOWN") && !strings.HasPrefix(msg, "TRYAGAIN") && !strings.HasPrefix(msg, "READONLY") {
			return
		}
	}
	h.reload()
}

// sendScriptsOnce keeps c from sending a script (the budget and spend
// scripts add to counters) to a node again once a node may have run it:
// the cluster client retries a command after an EOF or a read timeout, on
// the same node or the slot's next one, and a settlement run twice refunds
// twice. Node clients of a cluster do not retry on their own (go-redis'
// default for them); this stops the cluster client's loop. An answer of
// Redis (MOVED, ASK, NOSCRIPT, TRYAGAIN) or a failed dial means the
// script did not run, so those are still followed.
func sendScriptsOnce(c *redis.ClusterClient) {
	c.AddHook(scriptAttempts{})
	c.OnNewNode(func(node *redis.Client) { node.AddHook(scriptSentOnce{}) })
}

// scriptAttempts gives each script sent through the cluster client a
// record, in its context, of whether a node may have run it.
type scriptAttempts struct{}

type mayHaveRunKey struct{}

func (scriptAttempts) DialHook(next redis.DialHook) redis.DialHook { return next }
func (scriptAttempts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (scriptAttempts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !isScript(cmd) {
			return next(ctx, cmd)
		}
		return next(context.WithValue(ctx, mayHaveRunKey{}, new(atomic.Bool)), cmd)
	}
}

// scriptSentOnce, on every node client, refuses to send a script whose
// earlier attempt may have run.
type scriptSentOnce struct{}

// errAnswerLost is a script's error once a node may have run it and its
// answer was lost: the caller cannot know, and must not resend it.
var errAnswerLost = errors.New("redis: a script's answer was lost and it may have run; not sent again")

func (scriptSentOnce) DialHook(next redis.DialHook) redis.DialHook { return next }
func (scriptSentOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (scriptSentOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ran, ok := ctx.Value(mayHaveRunKey{}).(*atomic.Bool)
		if !ok {
			return next(ctx, cmd)
		}
		if ran.Load() {
			cmd.SetErr(errAnswerLost)
			return errAnswerLost
		}
		err := next(ctx, cmd)
		if mayHaveRun(err) {
			ran.Store(true)
		}
		return err
	}
}

func isScript(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "eval", "evalsha", "fcall":
		return true
	}
	return false
}

// mayHaveRun tells whether a command that failed with err may have run:
// anything but an answer of Redis or a connection that was never made.
func mayHaveRun(err error) bool {
	if err == nil {
		return false
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return false
	}
	var op *net.OpError
	return !errors.As(err, &op) || op.Op != "dial"
}

// newSeals is the keyring sealing reservations and gate fields, and the
// record of the seals used. With Redis both are the replicas' (a request's
// gate and meter streams may land on different replicas): whoever can
// read Redis can move its counters anyway, so sharing the keys there adds
// no exposure. The keys are read now (Redis unreachable: this replica
// seals with its own until it can read them; run re-reads them).
//
// With the embedded ledger both are in its file: a seal made before a
// restart is verified and claimed once after it, so a request admitted
// before a crash still settles on its proof.
func newSeals(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, ledger *ledgerfile.DB, log *slog.Logger, now func() time.Time) (*seal.Keyring, seal.Once, error) {
	r := cfg.Reservations
	opts := seal.Options{Rotation: r.KeyRotation, Refresh: r.KeyRefresh, MaxAge: r.MaxAge, Now: now, Log: log}
	if ledger != nil {
		ring := seal.NewKeyring(seal.EmbeddedStore{DB: ledger, Now: now}, opts)
		if err := ring.Refresh(ctx); err != nil {
			return nil, nil, fmt.Errorf("reservation keys in %s: %w", cfg.RateLimit.Embedded.Path, err)
		}
		once, err := seal.NewEmbeddedOnce(ledger, "", r.MaxSettled, r.MaxSettledPerTenant, now)
		return ring, once, err
	}
	if rdb == nil {
		ring := seal.NewKeyring(&seal.MemoryStore{}, opts)
		_ = ring.Refresh(ctx) // a MemoryStore does not fail
		return ring, &seal.MemoryOnce{Max: r.MaxSettled, PerTenant: r.MaxSettledPerTenant, Now: now}, nil
	}
	ring := seal.NewKeyring(seal.RedisStore{Client: rdb}, opts)
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := ring.Refresh(rctx); err != nil {
		log.Warn("could not read the shared reservation keys from Redis; sealing with this replica's own until it can", "err", err)
	}
	// Claims and issues are retried (seal.DefaultRetry: they are
	// idempotent), each try bounded by the client's timeouts above.
	return ring, seal.RedisOnce{Client: rdb, Now: now, PerTenant: r.MaxSettledPerTenant}, nil
}

// health is nil, or why the last reload of keys or policies was refused.
func (p *Admission) Health() error {
	var errs []error
	if p.policy != nil {
		errs = append(errs, p.policy.Health())
	}
	if e := p.keysErr.Load(); e != nil {
		errs = append(errs, *e)
	}
	return errors.Join(errs...)
}

// run watches the key file and the policy directory until ctx is done.
func (p *Admission) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if p.watchKeys != nil {
		wg.Go(func() { p.watchKeys(ctx) })
	}
	if p.policy != nil {
		wg.Go(func() { p.policy.Run(ctx) })
	}
	wg.Go(func() { p.seals.Run(ctx) })
	wg.Wait()
}

// close releases the limiter's Redis connection or ledger file: after
// everything that settles reservations has stopped.
func (p *Admission) Close() {
	if p.Redis != nil {
		p.Redis.Close()
	}
	if p.ledger != nil {
		p.ledger.Close()
	}
}

// newSpend is the spend ledger, kept where the budgets are counted: in
// this process with the memory backend, in the ledger's file with the
// embedded one, in Redis (every replica's) with Redis.
func newSpend(cfg *config.Config, rdb redis.UniversalClient, ledger *ledgerfile.DB, keys *identity.KeySet, log *slog.Logger, clock func() time.Time) *spend.Ledger {
	l := &spend.Ledger{Store: &spend.Memory{}, Prices: cfg.Prices.Table(), Now: clock, Log: log}
	switch {
	case ledger != nil:
		l.Store = &spend.Embedded{DB: ledger}
	case rdb != nil:
		l.Store = &spend.Redis{Client: rdb}
	}
	if keys != nil {
		l.Team = func(id string) string { return keys.Load().Label(id, "team") }
		l.KeyInfo = func(id string) (string, string) {
			e, _ := keys.Load().Entry(id)
			return e.Name, e.Owner
		}
	}
	return l
}
