package seal

import (
	"context"
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

// RedisOnce is a Once the replicas share: SET NX with the seal's
// remaining life as its TTL (a key per seal used, until it expires).
type RedisOnce struct {
	Client redis.UniversalClient
	Now    func() time.Time
}

// Issue implements Once: RedisOnce records the seals used, not those
// issued (no write on the request's path).
func (RedisOnce) Issue(Purpose, string, time.Time) error { return nil }

// Claim implements Once.
func (o RedisOnce) Claim(ctx context.Context, p Purpose, id string, expires time.Time) (bool, error) {
	ttl := expires.Sub(o.Now())
	if ttl <= 0 {
		return false, ErrExpired
	}
	return o.Client.SetNX(ctx, "ig:sealed:"+string(p)+":"+id, 1, max(ttl, time.Millisecond)).Result()
}
