package spend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store keeps the hour buckets. Add counts a (a charge: its parts are
// non-negative, a negative part counts as 0) in hour's bucket under the
// row Shares.Slot gives k (k bounded, Key.Bounded), each part saturating
// at math.MaxInt64; Hours reads the buckets from hour first to last.
type Store interface {
	Add(ctx context.Context, hour int64, k Key, a Amount) error
	Hours(ctx context.Context, first, last int64) (map[int64]Bucket, error)
}

// charge is a with its negative parts counted as 0: a Store adds charges.
func (a Amount) charge() Amount {
	return Amount{Requests: max(a.Requests, 0), InputTokens: max(a.InputTokens, 0), CachedTokens: max(a.CachedTokens, 0),
		OutputTokens: max(a.OutputTokens, 0), Cost: max(a.Cost, 0)}
}

// Memory is a Store in this process: the budgets are counted here too
// (ratelimit.backend: memory). Buckets older than Retention are dropped.
type Memory struct {
	Shares Shares // per bucket; zero fields: the defaults

	mu      sync.Mutex
	buckets map[int64]*Tally
	newest  int64
}

// Add implements Store.
func (m *Memory) Add(_ context.Context, hour int64, k Key, a Amount) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buckets == nil {
		m.buckets = map[int64]*Tally{}
	}
	if hour > m.newest {
		m.newest = hour
		for h := range m.buckets {
			if h <= hour-int64(Retention/time.Hour) {
				delete(m.buckets, h)
			}
		}
	}
	if hour <= m.newest-int64(Retention/time.Hour) {
		return nil // past retention: a report would not read it
	}
	b := m.buckets[hour]
	if b == nil {
		b = &Tally{}
		m.buckets[hour] = b
	}
	b.Add(k, a.charge(), m.Shares)
	return nil
}

// Hours implements Store.
func (m *Memory) Hours(_ context.Context, first, last int64) (map[int64]Bucket, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[int64]Bucket{}
	for h, b := range m.buckets {
		if h >= first && h <= last {
			out[h] = b.Bucket()
		}
	}
	return out, nil
}

// Redis is a Store in Redis, shared by the replicas that count their
// budgets there: one hash per hour (<Prefix><hour>), five fields per key
// and the bucket's row counts, living Retention. An Add is one round trip
// (addScript), which places the key (Shares.Slot's rule) and counts it
// atomically, so replicas filling a bucket at once never take it, a
// tenant or a key past its share.
type Redis struct {
	Client redis.UniversalClient
	Prefix string // default DefaultRedisPrefix
	Shares Shares // per bucket; zero fields: the defaults
}

// DefaultRedisPrefix starts every bucket's Redis key.
const DefaultRedisPrefix = "ig:spend:"

// The fields of a key in a bucket: its encoding (Key's fields joined by
// '\x1f', which Bounded keeps out of them), '\x1e', then one letter per
// part of an Amount.
const (
	fieldSep = "\x1f"
	partSep  = "\x1e"
)

func encodeKey(k Key) string {
	return k.Tenant + fieldSep + k.Team + fieldSep + k.KeyID + fieldSep + k.Model
}

// addScript counts an Amount in a bucket, placing its key as Shares.Slot
// does. KEYS[1] the bucket; ARGV: the shares per key, per tenant and in
// all, the TTL in seconds, the encodings of the key, its key's fold row,
// its tenant's fold row and OtherKey, then the five parts (non-negative).
// Besides its rows' fields, a bucket counts its rows in fields starting
// '\29' (which Bounded keeps out of keys, and decodeBucket skips): all
// rows, a tenant's, a (tenant, team, key)'s. Parts saturate at
// math.MaxInt64 (HINCRBY would fail on overflow, losing the charge),
// compared exactly as decimal strings split at 10⁹ (Lua's numbers are
// doubles).
var addScript = redis.NewScript(`
local b = KEYS[1]
local MAX = '9223372036854775807'
local function split(s)
  local n = #s
  if n <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
end
local function exceeds(v, d, m)
  local vh, vl = split(v)
  local dh, dl = split(d)
  local mh, ml = split(m)
  local lo = vl + dl
  local hi = vh + dh + math.floor(lo / 1e9)
  lo = lo % 1e9
  return hi > mh or (hi == mh and lo > ml)
end
local function has(f) return redis.call('HEXISTS', b, f .. '\30r') == 1 end
local function tenantField(f) return '\29t' .. string.match(f, '^[^\31]*') end
local function keyField(f) return '\29k' .. string.match(f, '^(.*)\31') end
local function count(f) return tonumber(redis.call('HGET', b, f) or '0') end
local k, ko, to, other = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local f = k
if not has(k) then
  local all, tenant, key = count('\29a'), count(tenantField(k)), count(keyField(k))
  local room = all < tonumber(ARGV[3])
  local tenantRoom = room and tenant < tonumber(ARGV[2])
  if tenantRoom and key < tonumber(ARGV[1]) then f = k
  elseif has(ko) or tenantRoom then f = ko
  elseif has(to) or room then f = to
  else f = other end
  if not has(f) then
    redis.call('HINCRBY', b, '\29a', 1)
    if f ~= other then
      redis.call('HINCRBY', b, tenantField(f), 1)
      redis.call('HINCRBY', b, keyField(f), 1)
    end
  end
end
local parts = {'r', 'i', 'c', 'o', 'm'}
for i, p in ipairs(parts) do
  local field = f .. '\30' .. p
  local d = ARGV[8 + i]
  if exceeds(redis.call('HGET', b, field) or '0', d, MAX) then
    redis.call('HSET', b, field, MAX)
  else
    redis.call('HINCRBY', b, field, d)
  end
end
redis.call('EXPIRE', b, ARGV[4])
return 1
`)

func (r *Redis) key(hour int64) string {
	p := r.Prefix
	if p == "" {
		p = DefaultRedisPrefix
	}
	return p + strconv.FormatInt(hour, 10)
}

// Add implements Store.
func (r *Redis) Add(ctx context.Context, hour int64, k Key, a Amount) error {
	s, k, a := r.Shares.OrDefault(), k.Bounded(), a.charge()
	err := addScript.Run(ctx, r.Client, []string{r.key(hour)}, s.PerKey, s.PerTenant, s.Total, int64(Retention/time.Second),
		encodeKey(k), encodeKey(k.keyFold()), encodeKey(k.tenantFold()), encodeKey(OtherKey),
		a.Requests, a.InputTokens, a.CachedTokens, a.OutputTokens, a.Cost).Err()
	if err != nil {
		return fmt.Errorf("spend: adding to %s: %w", r.key(hour), err)
	}
	return nil
}

// maxHours bounds the buckets one read asks for.
const maxHours = int64(Retention/time.Hour) + 48

// Hours implements Store: one pipelined HGETALL per hour.
func (r *Redis) Hours(ctx context.Context, first, last int64) (map[int64]Bucket, error) {
	if last-first >= maxHours {
		first = last - maxHours + 1
	}
	pipe := r.Client.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, 0, last-first+1)
	for h := first; h <= last; h++ {
		cmds = append(cmds, pipe.HGetAll(ctx, r.key(h)))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("spend: reading buckets: %w", err)
	}
	out := map[int64]Bucket{}
	for i, c := range cmds {
		if len(c.Val()) == 0 {
			continue
		}
		out[first+int64(i)] = decodeBucket(c.Val())
	}
	return out, nil
}

// decodeBucket reads a bucket's hash; fields it cannot read are skipped
// (Redis is trusted, but not to hold only what this version wrote).
func decodeBucket(fields map[string]string) Bucket {
	b := Bucket{}
	for f, v := range fields {
		enc, part, ok := strings.Cut(f, partSep)
		kf := strings.Split(enc, fieldSep)
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || len(kf) != 4 || err != nil {
			continue
		}
		k := Key{Tenant: kf[0], Team: kf[1], KeyID: kf[2], Model: kf[3]}
		a := b[k]
		switch part {
		case "r":
			a.Requests = n
		case "i":
			a.InputTokens = n
		case "c":
			a.CachedTokens = n
		case "o":
			a.OutputTokens = n
		case "m":
			a.Cost = n
		default:
			continue
		}
		b[k] = a
	}
	return b
}
