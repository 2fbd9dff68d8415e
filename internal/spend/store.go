package spend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store keeps the hour buckets. Add counts a in hour's bucket under k (k
// bounded, Key.Bounded) or, when the bucket is full, under OtherKey
// (Bucket.Slot); Hours reads the buckets from hour first to last.
type Store interface {
	Add(ctx context.Context, hour int64, k Key, a Amount) error
	Hours(ctx context.Context, first, last int64) (map[int64]Bucket, error)
}

// DefaultMaxKeys bounds the keys an hour's bucket holds (the rest is
// folded into OtherKey).
const DefaultMaxKeys = 2000

// Memory is a Store in this process: the budgets are counted here too
// (ratelimit.backend: memory). Buckets older than Retention are dropped.
type Memory struct {
	MaxKeys int // per bucket; 0: DefaultMaxKeys

	mu      sync.Mutex
	buckets map[int64]Bucket
	newest  int64
}

// Add implements Store.
func (m *Memory) Add(_ context.Context, hour int64, k Key, a Amount) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.buckets == nil {
		m.buckets = map[int64]Bucket{}
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
		b = Bucket{}
		m.buckets[hour] = b
	}
	slot := b.Slot(k.Bounded(), cmp.Or(m.MaxKeys, DefaultMaxKeys))
	b[slot] = b[slot].Add(a)
	return nil
}

// Hours implements Store.
func (m *Memory) Hours(_ context.Context, first, last int64) (map[int64]Bucket, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[int64]Bucket{}
	for h, b := range m.buckets {
		if h >= first && h <= last {
			out[h] = maps.Clone(b)
		}
	}
	return out, nil
}

// Redis is a Store in Redis, shared by the replicas that count their
// budgets there: one hash per hour (<Prefix><hour>), five fields per key,
// living Retention. An Add is one round trip (addScript), which picks the
// key's slot and counts it atomically, so replicas filling a bucket at
// once never take it past MaxKeys+1 keys.
type Redis struct {
	Client  redis.UniversalClient
	Prefix  string // default DefaultRedisPrefix
	MaxKeys int    // per bucket; 0: DefaultMaxKeys
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

// addScript counts an Amount in a bucket: KEYS[1] the bucket; ARGV the
// most keys, the key's encoding, OtherKey's, the TTL in seconds, then the
// five parts. A key the bucket does not hold goes to OtherKey once the
// bucket holds MaxKeys keys (five fields each).
var addScript = redis.NewScript(`
local f = ARGV[2]
if redis.call('HEXISTS', KEYS[1], f .. '\30r') == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[1]) * 5 then
  f = ARGV[3]
end
local parts = {'r', 'i', 'c', 'o', 'm'}
for i, p in ipairs(parts) do
  redis.call('HINCRBY', KEYS[1], f .. '\30' .. p, ARGV[4 + i])
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
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
	err := addScript.Run(ctx, r.Client, []string{r.key(hour)}, cmp.Or(r.MaxKeys, DefaultMaxKeys),
		encodeKey(k.Bounded()), encodeKey(OtherKey), int64(Retention/time.Second),
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
