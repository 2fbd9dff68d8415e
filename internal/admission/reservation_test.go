package admission

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/infergate/infergate/internal/policy"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/seal"
	"github.com/infergate/infergate/internal/testutil/redisserver"
)

// The reservation codec writes what encoding/json writes and reads it back.
func TestReservationCodec(t *testing.T) {
	for _, r := range []sealedReservation{
		{proofBounds: unknownBounds},
		{Reservation: ratelimit.Reservation{Entries: []ratelimit.Entry{}}, proofBounds: proofBounds{MaxOutput: 0, MaxInput: maxBound}},
		{Reservation: ratelimit.Reservation{Entries: []ratelimit.Entry{{Counter: "tenant=acme/principal=k|requests|60000|1700000000000", Unit: ratelimit.Requests, Reserved: 1, ExpiresAt: 1700000060000, Limit: 60}}},
			proofBounds: proofBounds{MaxOutput: 4096, MaxInput: 12345}},
		{Reservation: ratelimit.Reservation{Entries: []ratelimit.Entry{
			{Counter: `tenant=a/model="q\uote" <&> é` + "\x01", Unit: ratelimit.TotalTokens, Reserved: 1 << 40, ExpiresAt: -1, Limit: 1 << 62},
			{Counter: "", Unit: ratelimit.OutputTokens, Reserved: 0, ExpiresAt: 0},
		}}, proofBounds: proofBounds{MaxOutput: -1, MaxInput: -1}},
	} {
		want, _ := json.Marshal(r)
		got := encodeReservation(r)
		if got != string(want) {
			t.Errorf("encoded\n %s\nwant\n %s", got, want)
		}
		back, err := decodeReservation(got)
		if err != nil {
			t.Fatal(err)
		}
		var std sealedReservation
		json.Unmarshal(want, &std)
		if !reflect.DeepEqual(back, std) {
			t.Errorf("decoded %+v, want %+v", back, std)
		}
	}
	for _, bad := range []string{"", "[]", `{"e":3}`, `{"e":[{"k":1,"u":"requests","r":1,"x":1}]}`, `{"e":[{"k":"a"}]}`, `{"e":[`,
		`{"e":[{"k":"a","u":"requests","r":1,"x":1,"l":-1}]}`, `{"e":[{"k":"a","u":"requests","r":1,"x":1,"l":"1"}]}`,
		`{"e":null,"o":-2}`, `{"e":null,"i":"1"}`, `{"e":null,"o":4611686018427387905}`, `{"e":null,"i":1.5}`} {
		if _, err := decodeReservation(bad); err == nil {
			t.Errorf("decoded %q", bad)
		}
	}
}

// settleStores are the settle-once records a Controller may use: its
// own, in memory, and the replicas' shared one in a real Redis.
func settleStores(t *testing.T, now func() time.Time) map[string]seal.Once {
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return map[string]seal.Once{
		"memory": &seal.MemoryOnce{Max: 100, Now: now},
		"redis":  seal.RedisOnce{Client: rdb, Now: now},
	}
}

// replayController reserves 120 of a 300-token budget per chat request.
func replayController(t *testing.T, now func() time.Time, once seal.Once) *Controller {
	c := newController(t)
	c.Now, c.Settled = now, once
	c.Limiter = ratelimit.NewMemory(now)
	c.Policy = &fakePolicy{d: policy.Decision{Allow: true, Limits: []ratelimit.Limit{
		{Name: "tpm", Key: "t=acme", Unit: ratelimit.TotalTokens, Amount: 300, Window: time.Minute},
	}}}
	return c
}

// A sealed reservation settles once: replayed with no usage (what
// whoever reaches the ext_proc port could send), it refunds the tenant
// once, not once per replay. Before, every replay refunded the whole
// reservation again, another request's included.
func TestReplayedReservationSettlesOnce(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	for name, once := range settleStores(t, clock) {
		t.Run(name, func(t *testing.T) {
			c := replayController(t, clock, once)
			ctx := context.Background()
			hdr := map[string]string{"x-api-key": secretKey}
			a, b := c.Decide(ctx, chat(hdr)), c.Decide(ctx, chat(hdr)) // 240 of 300 reserved
			if a.Deny != nil || b.Deny != nil {
				t.Fatal(a.Deny, b.Deny)
			}
			for range 5 {
				c.Settle(ctx, &request.Settlement{Reservation: a.Reservation, UsageRead: true, End: request.EndComplete})
			}
			// a refunded once: b's 120 still reserved, and this one's.
			if v := c.Decide(ctx, chat(hdr)); v.Deny != nil || v.Metadata["x-ratelimit-remaining-tokens"] != "60" {
				t.Fatalf("after 5 settlements of one reservation: remaining %v, denial %v; want 60", v.Metadata["x-ratelimit-remaining-tokens"], v.Deny)
			}
		})
	}
}

// A seal past its window's end plus the longest stream is refused: a
// settlement of huge usage sent hours later charges nothing into the
// window then in force (before, it locked the tenant out).
func TestExpiredReservationIsRefused(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	c := replayController(t, clock, nil)
	ctx := context.Background()
	hdr := map[string]string{"x-api-key": secretKey}
	v := c.Decide(ctx, chat(hdr))
	if v.Deny != nil {
		t.Fatal(v.Deny)
	}
	now = now.Add(time.Minute + DefaultLongestStream + time.Second)
	c.Settle(ctx, &request.Settlement{Reservation: v.Reservation, CompletionTokens: 100_000, UsageRead: true, End: request.EndComplete})
	if v := c.Decide(ctx, chat(hdr)); v.Deny != nil || v.Metadata["x-ratelimit-remaining-tokens"] != "180" {
		t.Fatalf("after an expired settlement: remaining %v, denial %v; want 180", v.Metadata["x-ratelimit-remaining-tokens"], v.Deny)
	}
}

// A reservation the gate released settles no more: its seal was claimed.
func TestReleasedReservationDoesNotSettle(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	c := replayController(t, clock, nil)
	ctx := context.Background()
	hdr := map[string]string{"x-api-key": secretKey}
	a, b := c.Decide(ctx, chat(hdr)), c.Decide(ctx, chat(hdr))
	if a.Deny != nil || b.Deny != nil {
		t.Fatal(a.Deny, b.Deny)
	}
	c.consume(ctx, a.Reservation) // as Decide does when it releases
	c.Settle(ctx, &request.Settlement{Reservation: a.Reservation, UsageRead: true, End: request.EndComplete})
	if v := c.Decide(ctx, chat(hdr)); v.Deny == nil {
		t.Fatalf("a released seal refunded its reservation: remaining %v", v.Metadata["x-ratelimit-remaining-tokens"])
	}
}

// A settlement whose record cannot be written (Redis unreachable: the
// claim uncertain) keeps the reservation charged whole, under its tenant;
// a full share refuses the request itself (TestFullTenantShareRefusesOnlyThatTenant).
func TestUnrecordableSettlementKeepsTheCharge(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	srv := redisserver.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialerRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	srv.Stop()
	for name, once := range map[string]seal.Once{
		"redis unreachable": seal.RedisOnce{Client: rdb, Now: clock},
	} {
		t.Run(name, func(t *testing.T) {
			c := replayController(t, clock, once)
			ctx := context.Background()
			hdr := map[string]string{"x-api-key": secretKey}
			v := c.Decide(ctx, chat(hdr))
			c.Settle(ctx, &request.Settlement{Reservation: v.Reservation, UsageRead: true, End: request.EndComplete})
			if v := c.Decide(ctx, chat(hdr)); v.Deny != nil || v.Metadata["x-ratelimit-remaining-tokens"] != "60" {
				t.Fatalf("remaining %v, denial %v; want 60 (both kept)", v.Metadata["x-ratelimit-remaining-tokens"], v.Deny)
			}
		})
	}
}

// A reservation sealed before bounds and limits were travels as unknown:
// no bound beyond the old one, no debt.
func TestReservationDecodeWithoutBounds(t *testing.T) {
	r, err := decodeReservation(`{"e":[{"k":"c","u":"total_tokens","r":5,"x":9}]}`)
	if err != nil {
		t.Fatal(err)
	}
	want := sealedReservation{ratelimit.Reservation{Entries: []ratelimit.Entry{{Counter: "c", Unit: ratelimit.TotalTokens, Reserved: 5, ExpiresAt: 9}}}, unknownBounds}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("decoded %+v, want %+v", r, want)
	}
}

// Nothing after verification decodes a giant reservation.
func TestReservationDecodeIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"e":[`)
	for i := range maxEntries + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"k":"c","u":"requests","r":1,"x":1}`)
	}
	b.WriteString(`]}`)
	for name, s := range map[string]string{
		"entries": b.String(),
		"counter": `{"e":[{"k":"` + strings.Repeat("c", maxCounter+1) + `","u":"requests","r":1,"x":1}]}`,
		"size":    `{"e":[{"k":"c","u":"requests","r":1,"x":1}],"pad":"` + strings.Repeat(" ", maxSealedReservation) + `"}`,
	} {
		if _, err := decodeReservation(s); err == nil {
			t.Errorf("decoded a reservation over its bound (%s)", name)
		}
	}
}
