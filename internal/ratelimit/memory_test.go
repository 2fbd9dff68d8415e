package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Ended windows are dropped, so memory is bounded by the live counters.
func TestMemoryDropsEndedWindows(t *testing.T) {
	clock := newFakeClock(t0)
	m := NewMemory(clock.Now)
	ctx := context.Background()
	minute := func(key string) []Limit { return []Limit{rpm("rpm", key, 10)} }
	hour := Limit{Name: "rph", Key: "h", Unit: Requests, Amount: 1 << 40, Window: time.Hour}
	for i := range 5000 {
		if _, err := m.Reserve(ctx, append(minute(fmt.Sprint("k", i)), hour), req(0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if got := m.Len(); got != 5001 {
		t.Fatalf("Len = %d, want 5001", got)
	}
	steps := []struct {
		at   time.Duration
		want int // counters after one Reserve on a fresh key at that time
	}{
		{59 * time.Second, 5002},
		{time.Minute, 2}, // the minute ended: only the hour and the new key stay
		{59 * time.Minute, 2},
		{time.Hour, 2}, // new hour, new minute
	}
	for i, s := range steps {
		clock.SetOffset(s.at)
		if _, err := m.Reserve(ctx, append(minute(fmt.Sprint("new", i)), hour), req(0, 0)); err != nil {
			t.Fatal(err)
		}
		if got := m.Len(); got != s.want {
			t.Errorf("at %s: Len = %d, want %d", s.at, got, s.want)
		}
	}
	if c := cap(m.expiry); c > 1024 {
		t.Errorf("expiry heap kept capacity %d after the burst expired", c)
	}
}

// Denied and too large requests create no counters.
func TestMemoryDenyCreatesNothing(t *testing.T) {
	ctx := context.Background()
	m := NewMemory(newFakeClock(t0).Now)
	if _, err := m.Reserve(ctx, []Limit{tpm("tpm", "k", 5)}, req(3, 3)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Reserve = %v; want ErrTooLarge", err)
	}
	if m.Len() != 0 {
		t.Errorf("Len = %d after a refusal, want 0", m.Len())
	}
	if res, err := m.Reserve(ctx, []Limit{tpm("b", "k2", 5)}, req(2, 2)); err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	res, err := m.Reserve(ctx, []Limit{tpm("a", "k1", 5), tpm("b", "k2", 5)}, req(1, 1))
	if err != nil || res.Allowed {
		t.Fatalf("Reserve = %+v, %v; want denied", res, err)
	}
	if m.Len() != 1 {
		t.Errorf("Len = %d after a denial, want 1", m.Len())
	}
}

func TestWindow(t *testing.T) {
	tests := []struct {
		now        int64
		w          time.Duration
		start, end int64
	}{
		{0, time.Minute, 0, 60_000},
		{59_999, time.Minute, 0, 60_000},
		{60_000, time.Minute, 60_000, 120_000},
		{1_700_006_400_123, time.Second, 1_700_006_400_000, 1_700_006_401_000},
		{1_700_006_400_123, 7 * time.Millisecond, 1_700_006_400_120, 1_700_006_400_127},
		{-1, time.Minute, -60_000, 0},
		{-60_000, time.Minute, -60_000, 0},
	}
	for _, tc := range tests {
		start, end := window(tc.now, tc.w)
		if start != tc.start || end != tc.end {
			t.Errorf("window(%d, %s) = %d, %d; want %d, %d", tc.now, tc.w, start, end, tc.start, tc.end)
		}
	}
}

// A counter created by a charge carried over from an ended window is the
// one Reserve then finds, and it is dropped when its window ends.
func TestMemoryCarriedCounter(t *testing.T) {
	clock := newFakeClock(t0.Add(50 * time.Second))
	m := NewMemory(clock.Now)
	ctx := context.Background()
	limits := []Limit{tpm("tpm", "k", 100)}
	res, err := m.Reserve(ctx, limits, req(10, 10))
	if err != nil || !res.Allowed {
		t.Fatalf("Reserve = %+v, %v", res, err)
	}
	clock.SetOffset(70 * time.Second)
	if err := m.Settle(ctx, res.Reservation, req(10, 90)); err != nil {
		t.Fatal(err)
	}
	if got := m.Len(); got != 2 { // the ended window's, not dropped yet, and the new one
		t.Fatalf("Len = %d, want 2", got)
	}
	if res, err := m.Reserve(ctx, limits, req(0, 21)); err != nil || res.Allowed || res.States[0].Remaining != 20 {
		t.Errorf("Reserve(21) with 80 carried over = %+v, %v; want denied with 20 remaining", res, err)
	}
	if got := m.Len(); got != 1 {
		t.Errorf("Len = %d after the old window was dropped, want 1", got)
	}
	clock.SetOffset(2 * time.Minute)
	if _, err := m.Reserve(ctx, limits, req(0, 0)); err != nil {
		t.Fatal(err)
	}
	if got := m.Len(); got != 1 {
		t.Errorf("Len = %d in the next window, want 1 (the carried counter dropped)", got)
	}
}
