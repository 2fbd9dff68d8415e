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

// RedisOnce is a Once the replicas share: a key per seal outstanding
// (issued, not yet claimed), expiring with the seal; the claim deletes it.
// Redis then holds the seals in flight, not every seal of the last hour
// (a key per seal used grew by thousands a minute under a soak's load).
type RedisOnce struct {
	Client redis.UniversalClient
	Now    func() time.Time
}

func onceKey(p Purpose, id string) string { return "ig:sealed:" + string(p) + ":" + id }

// Issue implements Once.
func (o RedisOnce) Issue(ctx context.Context, p Purpose, id string, expires time.Time) error {
	ttl := expires.Sub(o.Now())
	if ttl <= 0 {
		return ErrExpired
	}
	return o.Client.Set(ctx, onceKey(p, id), 1, max(ttl, time.Millisecond)).Err()
}

// Claim implements Once: the first claim deletes the outstanding key; a
// replay, or a seal never recorded, finds none.
func (o RedisOnce) Claim(ctx context.Context, p Purpose, id string, expires time.Time) (bool, error) {
	if !o.Now().Before(expires) {
		return false, ErrExpired
	}
	n, err := o.Client.Del(ctx, onceKey(p, id)).Result()
	return n == 1, err
}
