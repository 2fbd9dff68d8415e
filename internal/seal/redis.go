package seal

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisStore keeps the replicas' keys in Redis, one per period
// (ig:seal-key:<epoch>), each expiring once its seals have.
type RedisStore struct{ Client redis.UniversalClient }

const redisKeyPrefix = "ig:seal-key:"

// Key implements Store: SET NX, then GET, so every replica reads the one
// key the first writer stored.
func (s RedisStore) Key(ctx context.Context, epoch int64, fresh Key, ttl time.Duration) (Key, error) {
	name := redisKeyPrefix + strconv.FormatInt(epoch, 10)
	if err := s.Client.SetNX(ctx, name, fresh.ID+"."+base64.StdEncoding.EncodeToString(fresh.Secret), ttl).Err(); err != nil {
		return Key{}, err
	}
	v, err := s.Client.Get(ctx, name).Result()
	if err != nil {
		return Key{}, err
	}
	id, secret, ok := strings.Cut(v, ".")
	b, err := base64.StdEncoding.DecodeString(secret)
	if !ok || err != nil {
		return Key{}, errors.New("malformed key in " + name)
	}
	return Key{ID: id, Secret: b}, nil
}

// RedisOnce is a Once the replicas share. Per tenant, a sorted set of the
// seals it holds outstanding (issued, not yet claimed), scored by expiry,
// trimmed of the expired at each Issue and held to PerTenant; per seal, a
// key expiring with it. Both in one hash slot per tenant (a Redis Cluster
// spreads the tenants), written by one script each, so the count and the
// seals agree. A claim replaces the seal's key by a short-lived mark of
// its claimant (claimedTTL): the claimant's retry reads true again,
// anyone else's false. Redis then holds the seals in flight and the
// claims of the last few seconds, not every seal of the last hour (a key
// per seal used grew by thousands a minute under a soak's load).
//
// Both writes are retried within Retry (the client itself resends
// nothing: internal/cli): a reply lost to a read timeout is no answer.
type RedisOnce struct {
	Client    redis.UniversalClient
	Now       func() time.Time
	PerTenant int   // 0: DefaultTenantShare
	Retry     Retry // zero: DefaultRetry
}

// claimedTTL is how long a claim's mark outlives it: well past every retry
// of its claimant (DefaultRetry.Total, 1.5 s; the meter gives a claim 2 s),
// after which a copy of the seal finds nothing (refused all the same).
// Short, because the marks are two keys a request for as long as they
// live: at a minute, a soak's Redis held thousands more and still growing
// after its warm-up.
const claimedTTL = 10 * time.Second

// tenantTag is the hash tag of a tenant's keys: fixed length whatever the
// tenant's name (any bytes, braces included).
func tenantTag(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return "{" + b64.EncodeToString(sum[:9]) + "}"
}

func outstandingKey(tenant string) string { return "ig:seals:" + tenantTag(tenant) }

func onceKey(p Purpose, tenant, id string) string {
	return "ig:sealed:" + tenantTag(tenant) + ":" + string(p) + ":" + id
}

// issueScript: KEYS the tenant's set and the seal; ARGV now and expiry
// (Unix ms), the seal's member, the share. 1: recorded (or already), 0:
// the share is full.
var issueScript = redis.NewScript(`
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then return 1 end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 0 end
local ttl = tonumber(ARGV[2]) - tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
redis.call('SET', KEYS[2], 'o', 'PX', ttl)
return 1`)

// claimScript: KEYS the tenant's set and the seal; ARGV the seal's
// member, the claimant, the mark's TTL (ms). 1: claimed by this
// claimant, now or before; 0: never issued, expired, or another's.
var claimScript = redis.NewScript(`
local v = redis.call('GET', KEYS[2])
if v == 'o' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], 'c' .. ARGV[2], 'PX', ARGV[3])
  return 1
end
if v == 'c' .. ARGV[2] then return 1 end
return 0`)

// Issue implements Once.
func (o RedisOnce) Issue(ctx context.Context, p Purpose, tenant, id string, expires time.Time) error {
	now := o.Now()
	if !now.Before(expires) {
		return ErrExpired
	}
	keys := []string{outstandingKey(tenant), onceKey(p, tenant, id)}
	ms := max(expires.UnixMilli(), now.UnixMilli()+1)
	var ok int64
	err := o.Retry.do(ctx, func(ctx context.Context) (err error) {
		ok, err = issueScript.Run(ctx, o.Client, keys, now.UnixMilli(), ms, string(p)+":"+id, cmpOr(o.PerTenant, DefaultTenantShare)).Int64()
		return err
	})
	if err == nil && ok == 0 {
		return ErrTenantFull
	}
	return err
}

// Claim implements Once.
func (o RedisOnce) Claim(ctx context.Context, p Purpose, tenant, id, claimant string, expires time.Time) (bool, error) {
	if !o.Now().Before(expires) {
		return false, ErrExpired
	}
	if claimant == "" {
		return false, errors.New("a claim names no claimant")
	}
	keys := []string{outstandingKey(tenant), onceKey(p, tenant, id)}
	var n int64
	err := o.Retry.do(ctx, func(ctx context.Context) (err error) {
		n, err = claimScript.Run(ctx, o.Client, keys, string(p)+":"+id, claimant, claimedTTL.Milliseconds()).Int64()
		return err
	})
	return n == 1, err
}

// Outstanding is how many seals tenant holds (expired ones included until
// its next Issue trims them).
func (o RedisOnce) Outstanding(ctx context.Context, tenant string) (int64, error) {
	return o.Client.ZCard(ctx, outstandingKey(tenant)).Result()
}

// isAnswer tells an answer of Redis (a script's error: retrying changes
// nothing) from a reply that never came.
func isAnswer(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, redis.Nil)
}
