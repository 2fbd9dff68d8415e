package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisOptions tunes the Redis limiter; the zero value is ready to use.
type RedisOptions struct {
	// Prefix starts every counter key (default DefaultCounterPrefix). Give
	// each deployment sharing a Redis its own.
	Prefix string
	// HashTag, when set, makes every counter key
	// <Prefix>{<HashTag>}:<limit key>:... so that all counters live in one
	// Redis Cluster slot: every script call (a Reserve over any limits, the
	// Settle or Release of its reservation, a charge carried into a later
	// window) then touches one slot, whatever the limit keys hold. Neither
	// it nor Prefix may then contain '{' or '}'.
	//
	// Empty means DefaultClusterHashTag when the client is a
	// *redis.ClusterClient, and otherwise the limit key itself
	// (<Prefix>{<limit key>}:...), the layout of a standalone or
	// Sentinel-managed Redis, where slots do not matter. (That layout
	// would spread counters over a cluster, but a Reserve over limits with
	// different keys, such as the shipped policy's per-credential,
	// per-tenant and per-model budgets, would span slots and fail with
	// CROSSSLOT; so a cluster always gets one tag.)
	HashTag string
	// Grace is how long counters outlive their window in Redis, so that
	// replicas whose clocks lag a little still find them. Zero means one
	// window length; negative means none.
	Grace time.Duration
}

// Redis is a Limiter whose counters live in Redis, shared by all replicas:
// a standalone server, or a Redis Cluster through a *redis.ClusterClient
// (every counter then in one slot; see RedisOptions.HashTag).
//
// Each Reserve is one round trip running reserveScript, which reads every
// counter, decides, and increments all of them or none inside Redis, so
// concurrent replicas can never admit more than the limits allow. Settle
// and Release are one round trip running settleScript, which adjusts only
// counters that still exist, except that a charge carried over from an
// ended window creates its counter in the window in force. Scripts go by EVALSHA, falling back to EVAL when Redis does
// not know them (after a restart, failover or SCRIPT FLUSH).
//
// Counters are created with a TTL ending Grace (default one window) after
// their window ends, so Redis drops them without any sweeping, and a
// settlement from a replica whose clock lags still finds its counter.
//
// The caller's clock picks the windows (their starts are part of the
// counter keys) and the counters' time to live, so replicas need
// synchronised clocks (NTP): a replica whose clock is off by d opens and
// closes windows d early or late. Redis' own clock only runs the TTLs.
//
// Failures (connection refused, timeouts, script errors) are returned
// wrapping ErrUnavailable, except a cancelled ctx, returned as is. Bound
// the time a dead Redis costs with the client's options (DialTimeout,
// ReadTimeout, WriteTimeout, MaxRetries, DialerRetries) or a ctx deadline.
type Redis struct {
	client  redis.UniversalClient
	clock   Clock
	prefix  string
	hashTag string
	grace   time.Duration
}

// DefaultClusterHashTag is the hash tag of every counter on a Redis
// Cluster unless RedisOptions.HashTag names another: all counters live in
// the slot of "infergate" (CLUSTER KEYSLOT infergate), on one primary.
const DefaultClusterHashTag = "infergate"

// NewRedis returns a limiter using client; a nil clock means time.Now.
// With a *redis.ClusterClient every counter gets a hash tag (see
// RedisOptions.HashTag).
func NewRedis(client redis.UniversalClient, clock Clock, opts RedisOptions) *Redis {
	if clock == nil {
		clock = time.Now
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultCounterPrefix
	}
	if _, cluster := client.(*redis.ClusterClient); cluster && opts.HashTag == "" {
		opts.HashTag = DefaultClusterHashTag
	}
	return &Redis{client: client, clock: clock, prefix: opts.Prefix, hashTag: opts.HashTag, grace: opts.Grace}
}

// luaExact is what the scripts compare counters with. Lua's numbers are
// doubles, exact to 2⁵³ only, and a Money counter (pico-units) passes
// that at about 9,007 units of its currency: so counters, costs and
// amounts stay the decimal strings Redis and the client write, and are
// compared exactly, as strings or split at 10⁹ into parts a double holds
// exactly. Counters never go below zero, so every string is a
// non-negative integer without leading zeros. Nothing wraps: the reserve
// script increments only when used + cost <= amount <= math.MaxInt64, and
// the settle script saturates at MAXINT instead of letting INCRBY fail.
const luaExact = `
local function split(s)
  local n = #s
  if n <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
end
local function exceeds(used, cost, amount)
  local uh, ul = split(used)
  local ch, cl = split(cost)
  local ah, al = split(amount)
  local lo = ul + cl
  local hi = uh + ch + math.floor(lo / 1e9)
  lo = lo % 1e9
  return hi > ah or (hi == ah and lo > al)
end
local MAXINT = '9223372036854775807'
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
`

// reserveScript admits a request against all limits or none.
//
//	KEYS[i]      counter of limit i
//	ARGV[3i-2]   cost of limit i's unit
//	ARGV[3i-1]   limit i's amount
//	ARGV[3i]     TTL (ms) to give the counter if this call creates it
//
// Returns {1, 0, used_1..used_n} (values after the charge) when admitted,
// {0, i, used_1..used_n} (values as found) when limit i is the first
// exceeded; the values as decimal strings (exact past 2⁵³). A counter
// named twice (two limits on one key, unit and window) is charged once.
// Counters are created even for a zero cost so that Settle can later
// charge the actual usage to them.
var reserveScript = redis.NewScript(luaExact + `
local n = #KEYS
local res = {0, 0}
local found = {}
for i = 1, n do
  local v = redis.call('GET', KEYS[i])
  found[i] = v
  res[i + 2] = v or '0'
end
for i = 1, n do
  if exceeds(res[i + 2], ARGV[3 * i - 2], ARGV[3 * i - 1]) then
    res[2] = i
    return res
  end
end
res[1] = 1
local after = {}
for i = 1, n do
  local k = KEYS[i]
  local v = after[k]
  if v == nil then
    redis.call('INCRBY', k, ARGV[3 * i - 2])
    if not found[i] then
      redis.call('PEXPIRE', k, ARGV[3 * i])
    end
    v = redis.call('GET', k)
    after[k] = v
  end
  res[i + 2] = v
end
return res
`)

// settleScript applies the adjustments of a Settle or Release. Each
// adjustment is its counter in KEYS, then the counters of the windows its
// debt may go to (n of them, in order); in ARGV:
//
//	delta   what to add to the counter
//	ttl     0: adjust the counter only if it exists, flooring the result
//	        at zero, keeping its TTL; > 0: a charge carried over from an
//	        ended window into the window in force, which creates the
//	        counter with this TTL (ms) if it is absent
//	limit   the counter's limit, 0 for none: a charge that takes the
//	        counter past it moves the part over it (overLimit) into the
//	        debt counters, filling each up to the limit, the last taking
//	        the rest (debtPart)
//	n       how many debt counters follow the counter in KEYS
//	ttl_1..ttl_n   the TTL (ms) to create each with
//
// A counter saturates at math.MaxInt64 (INCRBY would fail on overflow,
// and a failed settlement would forget its charge), and then stays
// saturated, refunds included, and carries no debt (see addSat); it is
// floored at zero. SET ... KEEPTTL needs Redis 6.0 or later. A settlement
// of a window in force never creates a counter (Redis lost it: restart,
// eviction); a carried charge and a debt must, or they would be dropped
// whenever no request of the new window came first. All keys of one call
// share the hash tag of the reservation's counters, hence one slot.
var settleScript = redis.NewScript(luaExact + `
local function sub(a, b)
  local ah, al = split(a)
  local bh, bl = split(b)
  local hi, lo = ah - bh, al - bl
  if lo < 0 then lo = lo + 1e9; hi = hi - 1 end
  if hi == 0 then return string.format('%d', lo) end
  return string.format('%.0f%09d', hi, lo)
end
local ki, ai = 1, 1
while ki <= #KEYS do
  local k, d, ttl, limit, n = KEYS[ki], ARGV[ai], ARGV[ai + 1], ARGV[ai + 2], tonumber(ARGV[ai + 3])
  local v = redis.call('GET', k)
  local charged = string.sub(d, 1, 1) ~= '-' and d ~= '0'
  if v == MAXINT then
    charged = false -- saturated: stays so until its window ends (see addSat)
  elseif v then
    if string.sub(d, 1, 1) == '-' then
      if less(v, string.sub(d, 2)) then
        redis.call('DECRBY', k, v)
      else
        redis.call('INCRBY', k, d)
      end
    elseif exceeds(v, d, MAXINT) then
      redis.call('SET', k, MAXINT, 'KEEPTTL')
    else
      redis.call('INCRBY', k, d)
    end
  elseif tonumber(ttl) > 0 and charged then
    redis.call('SET', k, d, 'PX', ttl)
    v = '0'
  else
    charged = false
  end
  if charged and limit ~= '0' then
    local after = redis.call('GET', k)
    local base = v
    if less(base, limit) then base = limit end
    if less(base, after) then
      local debt = sub(after, base)
      redis.call('DECRBY', k, debt)
      for j = 1, n do
        if debt == '0' then break end
        local dk = KEYS[ki + j]
        local dv = redis.call('GET', dk)
        local part = debt
        if j < n then
          local room = '0'
          if less(dv or '0', limit) then room = sub(limit, dv or '0') end
          if less(room, debt) then part = room end
        end
        if part ~= '0' then
          if dv == MAXINT then
            -- saturated already
          elseif dv and exceeds(dv, part, MAXINT) then
            redis.call('SET', dk, MAXINT, 'KEEPTTL')
          elseif dv then
            redis.call('INCRBY', dk, part)
          else
            redis.call('SET', dk, part, 'PX', ARGV[ai + 3 + j])
          end
          debt = sub(debt, part)
        end
      end
    end
  end
  ki, ai = ki + 1 + n, ai + 4 + n
end
return 0
`)

// ttl is how long (ms) a counter of the window [startMs, endMs) is kept
// when created at nowMs: until its window ends, plus the grace (by
// default the window's length: a calendar month's counter outlives its
// month by as long again).
func (r *Redis) ttl(startMs, endMs, nowMs int64) int64 {
	ttl := endMs - nowMs
	switch {
	case r.grace == 0:
		ttl += endMs - startMs
	case r.grace > 0:
		ttl += r.grace.Milliseconds()
	}
	return max(ttl, 1)
}

// Reserve implements Limiter with one reserveScript round trip.
func (r *Redis) Reserve(ctx context.Context, limits []Limit, cost Cost) (Result, error) {
	if err := validate(limits, cost); err != nil {
		return Result{}, err
	}
	n := len(limits)
	if n == 0 {
		return Result{Allowed: true}, nil
	}
	now := r.clock()
	nowMs := now.UnixMilli()
	ids := make([]string, n)
	ends := make([]int64, n)
	counterIDs(r.prefix, r.hashTag, limits, nowMs, ids, ends)
	args := make([]any, 3*n)
	for i := range limits {
		l := &limits[i]
		args[3*i] = cost.Of(l.Unit)
		args[3*i+1] = l.Amount
		start, _ := window(nowMs, l.Window)
		args[3*i+2] = r.ttl(start, ends[i], nowMs)
	}
	vals, err := reserveScript.Run(ctx, r.client, ids, args...).Int64Slice()
	if answerLost(err) {
		// A reservation whose answer was lost is sent once more: if the
		// first one ran, it stays charged, and an over-charge is the
		// accounting rule's side to err on. (A settlement or a release is
		// never resent: run twice, it would refund twice.)
		vals, err = reserveScript.Run(ctx, r.client, ids, args...).Int64Slice()
	}
	if err != nil {
		return Result{}, r.fail("reserve", err)
	}
	if len(vals) != n+2 {
		return Result{}, fmt.Errorf("%w: redis: reserve script returned %d values for %d limits", ErrUnavailable, len(vals), n)
	}
	used := vals[2:]
	admitted := vals[0] == 1
	st, entries := newResult(n, admitted)
	fillStates(st, limits, used, ends, now)
	res := Result{States: st}
	if !admitted {
		i := int(vals[1]) - 1
		if i < 0 || i >= n {
			return Result{}, fmt.Errorf("%w: redis: reserve script denied with limit index %d", ErrUnavailable, vals[1])
		}
		res.Exceeded = &res.States[i].Limit
		res.RetryAfter = res.States[i].Reset
		return res, nil
	}
	for i := range limits {
		entries[i] = Entry{Counter: ids[i], Unit: limits[i].Unit, Reserved: cost.Of(limits[i].Unit), ExpiresAt: ends[i], Limit: limits[i].Amount}
	}
	res.Allowed = true
	res.Reservation = Reservation{Entries: dedupEntries(entries)}
	return res, nil
}

// Settle implements Limiter with at most one settleScript round trip
// (none when nothing changes: request entries, entries whose actual equals
// the reservation, and entries of ended windows with nothing to carry over
// are skipped; see settlePlan). Call it once per admitted reservation; a
// second call would apply the difference twice.
func (r *Redis) Settle(ctx context.Context, res Reservation, actual Cost) error {
	if err := checkActual(actual); err != nil {
		return err
	}
	nowMs := r.clock().UnixMilli()
	var buf [maxStackLimits]adjustment
	adj, err := settlePlan(res.Entries, actual, nowMs, buf[:0])
	if rerr := r.apply(ctx, "settle", adj, nowMs); rerr != nil {
		return rerr
	}
	return err
}

// Release implements Limiter with at most one settleScript round trip.
func (r *Redis) Release(ctx context.Context, res Reservation) error {
	nowMs := r.clock().UnixMilli()
	var buf [maxStackLimits]adjustment
	return r.apply(ctx, "release", releasePlan(res.Entries, nowMs, buf[:0]), nowMs)
}

// apply runs settleScript for adj, if there is anything to change.
func (r *Redis) apply(ctx context.Context, op string, adj []adjustment, nowMs int64) error {
	if len(adj) == 0 {
		return nil
	}
	keys := make([]string, 0, len(adj))
	args := make([]any, 0, 4*len(adj))
	for i := range adj {
		a := &adj[i]
		ttl, debts := "0", 0
		if a.carried {
			ttl = strconv.FormatInt(r.ttl(a.start, a.end, nowMs), 10)
		}
		if a.limit > 0 {
			debts = MaxDebtWindows
		}
		keys = append(keys, a.counter)
		args = append(args, strconv.FormatInt(a.delta, 10), ttl, strconv.FormatInt(a.limit, 10), debts)
		for k := 1; k <= debts; k++ {
			id, start, end := a.debtWindow(k)
			keys = append(keys, id)
			args = append(args, r.ttl(start, end, nowMs))
		}
	}
	if err := settleScript.Run(ctx, r.client, keys, args...).Err(); err != nil {
		return r.fail(op, err)
	}
	return nil
}

func (r *Redis) fail(op string, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: redis %s: %w", ErrUnavailable, op, err)
}

// answerLost tells whether a command that failed with err may have run
// with its answer lost (a cut connection, a read timeout): not an answer
// of Redis, a connection never made, nor the caller's cancellation.
func answerLost(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var rerr redis.Error
	var op *net.OpError
	return !errors.As(err, &rerr) && !(errors.As(err, &op) && op.Op == "dial")
}
