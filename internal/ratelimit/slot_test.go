package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// crc16 is the checksum Redis Cluster hashes keys with (Redis Cluster
// specification, "Keys distribution model"): CRC-16/XMODEM, polynomial
// 0x1021, initial value 0, no reflection, no final xor.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is HASH_SLOT(key): CRC16 of the part Redis hashes (the hash tag
// if the key has one, see clusterHashTag) modulo 16384.
func keySlot(key string) int { return int(crc16(clusterHashTag(key)) % 16384) }

// The slot function follows the specification: its CRC test vector, the
// slots the Redis documentation gives, and its hash tag rules.
// (TestRedisClusterSlotsMatchRedis checks it against a real cluster.)
func TestKeySlot(t *testing.T) {
	if got := crc16("123456789"); got != 0x31C3 {
		t.Errorf("crc16(123456789) = %#x, want 0x31c3", got)
	}
	for key, want := range map[string]int{"somekey": 11058, "foo{hash_tag}": 2515, "hash_tag": 2515} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	for key, hashed := range map[string]string{
		"{user1000}.following": "user1000",
		"foo{}{bar}":           "foo{}{bar}", // an empty tag: the whole key
		"foo{{bar}}zap":        "{bar",
		"foo{bar}{zap}":        "bar",
		"no tag":               "no tag",
		"open{only":            "open{only",
	} {
		if got := clusterHashTag(key); got != hashed {
			t.Errorf("clusterHashTag(%q) = %q, want %q", key, got, hashed)
		}
	}
}

// scriptCall is one script a limiter ran: which, and its keys.
type scriptCall struct {
	op   string // reserve or settle (Settle and Release both run settleScript)
	keys []string
}

// scriptRecorder is a go-redis hook that answers the limiter's scripts
// itself, with no server (every Reserve admitted), and records the keys
// of every call: exactly what a server would have been sent.
type scriptRecorder struct {
	mu    sync.Mutex
	calls []scriptCall
}

func (r *scriptRecorder) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *scriptRecorder) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(context.Context, []redis.Cmder) error { return errors.New("scriptRecorder: unexpected pipeline") }
}

func (r *scriptRecorder) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		c, ok := cmd.(*redis.Cmd)
		if cmd.Name() != "evalsha" || !ok || len(args) < 3 {
			return fmt.Errorf("scriptRecorder: unexpected command %v", args)
		}
		n := args[2].(int)
		keys := make([]string, n)
		for i := range n {
			keys[i] = args[3+i].(string)
		}
		var op string
		switch args[1] {
		case reserveScript.Hash():
			op = "reserve"
			vals := make([]any, n+2)
			vals[0], vals[1] = int64(1), int64(0)
			for i := range n {
				vals[2+i] = int64(0)
			}
			c.SetVal(vals)
		case settleScript.Hash():
			op = "settle"
			c.SetVal(int64(0))
		default:
			return fmt.Errorf("scriptRecorder: unknown script %v", args[1])
		}
		r.mu.Lock()
		r.calls = append(r.calls, scriptCall{op: op, keys: keys})
		r.mu.Unlock()
		return nil
	}
}

func (r *scriptRecorder) take() []scriptCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.calls
	r.calls = nil
	return out
}

// recordingLimiter returns a limiter on a client that never reaches a
// server: a cluster client (as the composition root makes for mode:
// cluster) or a standalone one.
func recordingLimiter(t *testing.T, cluster bool, clock Clock, opts RedisOptions) (*Redis, *scriptRecorder) {
	t.Helper()
	rec := &scriptRecorder{}
	var client redis.UniversalClient
	if cluster {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
		c.AddHook(rec)
		client = c
	} else {
		c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
		c.AddHook(rec)
		client = c
	}
	t.Cleanup(func() { _ = client.Close() })
	return NewRedis(client, clock, opts), rec
}

// shippedLimits are the limits policies/ratelimit.rego states for one
// request: per credential, per tenant, per tenant and model; three keys.
func shippedLimits(tenant, principal, model string) []Limit {
	return []Limit{
		{Name: "requests-per-minute", Key: "tenant=" + tenant + "/principal=" + principal, Unit: Requests, Amount: 20, Window: time.Minute},
		{Name: "tenant-tokens-per-minute", Key: "tenant=" + tenant, Unit: TotalTokens, Amount: 20000, Window: time.Minute},
		{Name: "model-output-tokens-per-hour", Key: "tenant=" + tenant + "/model=" + model, Unit: OutputTokens, Amount: 100000, Window: time.Hour},
	}
}

// limitSets are representative sets of limits one request reserves: the
// shipped policy's for several callers, a model-wide limit next to a
// tenant's, keys holding braces, colons, slashes, spaces and non-ASCII,
// an empty key, every unit and window length at once, and 300 random
// sets over an alphabet rich in braces.
func limitSets() [][]Limit {
	sets := [][]Limit{
		shippedLimits("acme", "acme-prod", "llama-3.1-8b-instruct"),
		shippedLimits("globex", "globex-app", "mixtral-8x22b-instruct"),
		shippedLimits("initech", "", "qwen2.5-7b-instruct"), // an anonymous principal
		shippedLimits("{acme}", "}{", "{"),
		append(shippedLimits("acme", "acme-prod", "m"), Limit{Name: "model-wide", Key: "model=m", Unit: Requests, Amount: 1000, Window: time.Second}),
		{tpm("braces", "t={x}:y", 1000), rpm("open", "{", 10), rpm("close", "}", 10), rpm("empty", "", 10), tpm("pair", "{}", 100)},
		{tpm("spaces", "tenant=a b/c d", 100), tpm("unicode", "租户=甲/模型=乙", 100), rpm("colons", "a:b:c:1:2", 5)},
	}
	var all []Limit
	for i, u := range []Unit{Requests, InputTokens, OutputTokens, TotalTokens} {
		for j, w := range []time.Duration{1500 * time.Millisecond, time.Minute, time.Hour, 24 * time.Hour} {
			all = append(all, Limit{Name: fmt.Sprintf("l%d%d", i, j), Key: fmt.Sprintf("k%d", (i+j)%3), Unit: u, Amount: 1 << 40, Window: w})
		}
	}
	sets = append(sets, all)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("ab{}:/= {租")
	units := []Unit{Requests, InputTokens, OutputTokens, TotalTokens}
	windows := []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}
	for range 300 {
		var set []Limit
		for i := range 1 + rng.IntN(8) {
			key := make([]rune, rng.IntN(12))
			for j := range key {
				key[j] = alphabet[rng.IntN(len(alphabet))]
			}
			set = append(set, Limit{Name: fmt.Sprint("r", i), Key: string(key), Unit: units[rng.IntN(len(units))],
				Amount: 1 << 40, Window: windows[rng.IntN(len(windows))]})
		}
		sets = append(sets, set)
	}
	return sets
}

// exercise makes every kind of script call a request's life brings:
// Reserve, Settle in the window (a refund and a charge), Release, a
// Settle after the minute ended but not the hour (carried and in-window
// entries in one call), and a Settle days later (everything carried).
func exercise(t *testing.T, l *Redis, clock *fakeClock, limits []Limit) {
	t.Helper()
	ctx := context.Background()
	reserve := func() Reservation {
		t.Helper()
		res, err := l.Reserve(ctx, limits, req(10, 20))
		if err != nil || !res.Allowed {
			t.Fatalf("Reserve(%+v) = %+v, %v", limits, res, err)
		}
		return res.Reservation
	}
	clock.SetOffset(50 * time.Second)
	if err := l.Settle(ctx, reserve(), req(15, 5)); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, reserve()); err != nil {
		t.Fatal(err)
	}
	r := reserve()
	clock.SetOffset(61 * time.Second)
	if err := l.Settle(ctx, r, req(40, 70)); err != nil {
		t.Fatal(err)
	}
	clock.SetOffset(50 * time.Second)
	r = reserve()
	clock.SetOffset(72 * time.Hour)
	if err := l.Settle(ctx, r, req(40, 70)); err != nil {
		t.Fatal(err)
	}
}

// The slot proof: on a cluster client, every key of every script call the
// limiter makes (Reserve over all the limits of a request, Settle,
// Release, charges carried into later windows) hashes to one slot, the
// slot of the hash tag, for every representative set of limits; so no
// call can fail with CROSSSLOT, whatever the policy puts in its keys.
// The layout of a standalone Redis (each limit key its own tag) would
// spread the shipped policy's three keys over three slots: that is why a
// cluster gets one tag.
func TestRedisClusterScriptsStayInOneSlot(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts RedisOptions
		tag  string
	}{
		{"default hash tag", RedisOptions{}, DefaultClusterHashTag},
		{"configured hash tag", RedisOptions{HashTag: "budgets", Prefix: "p:"}, "budgets"},
		{"hash tag with odd characters", RedisOptions{HashTag: "ig:rl/2 ü"}, "ig:rl/2 ü"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock(t0)
			l, rec := recordingLimiter(t, true, clock.Now, tc.opts)
			want := keySlot(tc.tag)
			calls, keys := map[string]int{}, 0
			for _, limits := range limitSets() {
				exercise(t, l, clock, limits)
				got := rec.take()
				if len(got) < 5 {
					t.Fatalf("%d script calls for %+v, want at least 5", len(got), limits)
				}
				for _, c := range got {
					calls[c.op]++
					for _, k := range c.keys {
						keys++
						if clusterHashTag(k) != tc.tag || keySlot(k) != want {
							t.Fatalf("%s key %q hashes %q to slot %d; want tag %q, slot %d (call keys %q)",
								c.op, k, clusterHashTag(k), keySlot(k), tc.tag, want, c.keys)
						}
					}
				}
			}
			t.Logf("%d reserve and %d settle/release calls, %d keys: all in slot %d (hash tag %q)",
				calls["reserve"], calls["settle"], keys, want, tc.tag)
		})
	}

	t.Run("the standalone layout would span slots", func(t *testing.T) {
		clock := newFakeClock(t0)
		l, rec := recordingLimiter(t, false, clock.Now, RedisOptions{})
		exercise(t, l, clock, shippedLimits("acme", "acme-prod", "llama-3.1-8b-instruct"))
		slots := map[int]bool{}
		for _, k := range rec.take()[0].keys {
			slots[keySlot(k)] = true
		}
		if len(slots) != 3 {
			t.Errorf("the shipped policy's keys without a common tag are in %d slots, want 3", len(slots))
		}
	})
}

// The counter ids on a cluster: the tag, then the limit key whole.
func TestRedisClusterCounterIDs(t *testing.T) {
	clock := newFakeClock(t0)
	l, rec := recordingLimiter(t, true, clock.Now, RedisOptions{})
	if _, err := l.Reserve(context.Background(), shippedLimits("acme", "acme-prod", "m"), req(1, 2)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ig:rl:{infergate}:tenant=acme/principal=acme-prod:requests:60000:1700006400000",
		"ig:rl:{infergate}:tenant=acme:total_tokens:60000:1700006400000",
		"ig:rl:{infergate}:tenant=acme/model=m:output_tokens:3600000:1700006400000",
	}
	if got := rec.take()[0].keys; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("keys = %q, want %q", got, want)
	}
}
