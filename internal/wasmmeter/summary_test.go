package wasmmeter

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/openai"
)

func sample() Summary {
	return Summary{
		Start: time.UnixMicro(1_767_000_000_123_456), Complete: true, SSE: true, HasFirst: true,
		TTFT: 201 * time.Millisecond, E2E: 532*time.Millisecond + 7*time.Microsecond,
		API: openai.APIMessages, ContentEvents: 12, Usage: &openai.Usage{PromptTokens: 6, CompletionTokens: 12, TotalTokens: 18},
		Input: 6, HasInput: true,
		BadEvents: 1, Dropped: 2, Overflowed: 3, ITLMax: 30 * time.Millisecond,
		ResponseModel: "pool|a%b", Gaps: []time.Duration{30 * time.Millisecond, 29*time.Millisecond + 985*time.Microsecond, 0},
	}
}

func TestSummaryRoundTrip(t *testing.T) {
	want := sample()
	enc := want.Encode()
	if enc != "2|31|1767000000123456|201000|532007|12|6|12|1|2|3|30000|pool%7Ca%25b|30000,29985,0|messages|6" {
		t.Errorf("encoded %q", enc)
	}
	got, err := Parse(enc)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
	// A later writer of version 2 may append fields.
	if _, err := Parse(enc + "|more|fields"); err != nil {
		t.Errorf("appended fields: %v", err)
	}
	// No usage, no first token, no gaps: absent, not zero.
	none := Summary{Start: want.Start, E2E: time.Second}
	got, err = Parse(none.Encode())
	if err != nil || got.Usage != nil || got.HasFirst || got.Gaps != nil || got.Complete || got.API != "" || got.HasInput {
		t.Errorf("empty summary: %+v, %v", got, err)
	}
	// An output counted alone: its input is the gate's to fill.
	out := Summary{Start: want.Start, Usage: &openai.Usage{CompletionTokens: 3, TotalTokens: 3}, OutputOnly: true}
	if got, err = Parse(out.Encode()); err != nil || !reflect.DeepEqual(got, out) {
		t.Errorf("output-only usage: %+v, %v", got, err)
	}
}

// infergate still reads version 1: a module built before it was upgraded.
func TestParseVersion1(t *testing.T) {
	want := sample()
	want.API, want.Input, want.HasInput = "", 0, false
	got, err := Parse("1|15|1767000000123456|201000|532007|12|6|12|1|2|3|30000|pool%7Ca%25b|30000,29985,0")
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("version 1: %+v, %v", got, err)
	}
	for _, bad := range []string{
		"1|16|1767000000123456|201000|532007|12|6|12|1|2|3|30000|m|", // a version 2 flag
		"1|15|1767000000123456|201000|532007|12|6|12|1|2|3|30000|m",  // too few
	} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if _, err := Parse("1|15|1767000000123456|201000|532007|12|6|12|1|2|3|30000|m||x|y"); err != nil {
		t.Errorf("version 1 with appended fields: %v", err)
	}
}

// Encode clamps what it cannot carry: the result always parses.
func TestEncodeBounds(t *testing.T) {
	s := sample()
	s.ResponseModel = strings.Repeat("é", 200) + "\xff"
	s.Gaps = make([]time.Duration, MaxGaps+10)
	for i := range s.Gaps {
		s.Gaps[i] = 100 * time.Hour // over the bound
	}
	s.TTFT, s.ContentEvents, s.BadEvents = -time.Second, -1, 1<<40
	enc := s.Encode()
	if len(enc) > MaxSummary {
		t.Fatalf("encoded %d bytes, over MaxSummary", len(enc))
	}
	got, err := Parse(enc)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Gaps) != MaxGaps || got.Gaps[0] != maxDuration || got.TTFT != 0 || got.ContentEvents != 0 ||
		got.BadEvents != maxCount || len(got.ResponseModel) > MaxModel {
		t.Errorf("clamped: %d gaps, first %v, ttft %v, events %d, bad %d, model %d bytes",
			len(got.Gaps), got.Gaps[0], got.TTFT, got.ContentEvents, got.BadEvents, len(got.ResponseModel))
	}
}

func TestParseRefusesMalformed(t *testing.T) {
	s := sample()
	good := s.Encode()
	for name, in := range map[string]string{
		"empty":         "",
		"other version": "3" + good[1:],
		"too few":       "2|15|1767000000123456|201000",
		"no input":      strings.TrimSuffix(good, "|6"),
		"unknown api":   strings.Replace(good, "|messages|", "|chat2|", 1),
		"bad input":     strings.TrimSuffix(good, "|6") + "|-6",
		"negative":      strings.Replace(good, "|12|6|", "|-12|6|", 1),
		"not a number":  strings.Replace(good, "|12|6|", "|x|6|", 1),
		"huge count":    strings.Replace(good, "|12|6|", "|99999999999|6|", 1),
		"huge duration": strings.Replace(good, "|201000|", "|999999999999|", 1),
		"bad flags":     strings.Replace(good, "2|31|", "2|64|", 1),
		"zero start":    strings.Replace(good, "|1767000000123456|", "|0|", 1),
		"bad gap":       strings.Replace(good, "29985,0|", "29985,0,|", 1),
		"long model":    strings.Replace(good, "pool%7Ca%25b", strings.Repeat("m", MaxModel+1), 1),
		"invalid utf-8": strings.Replace(good, "pool%7Ca%25b", "\xff", 1),
		"too many gaps": strings.Replace(good, "30000,29985,0", strings.Repeat("1,", MaxGaps)+"1", 1),
		"too long":      good + "|" + strings.Repeat("x", MaxSummary),
	} {
		if _, err := Parse(in); err == nil {
			t.Errorf("%s: %q parsed", name, in[:min(len(in), 120)])
		}
	}
}

// Parse never panics, accepts only what is within bounds, and what it
// accepts encodes back to a summary that parses the same.
func FuzzParse(f *testing.F) {
	s := sample()
	f.Add(s.Encode())
	f.Add((&Summary{Start: time.UnixMicro(1), E2E: time.Millisecond}).Encode())
	f.Add("1|3|1767000000000000||0|0|0|0|0|0|0|0||")
	f.Add("1|15|1767000000123456|201000|532007|12|6|12|1|2|3|30000|m|30000,29985,0")
	f.Add("2|63|1767000000123456|201000|532007|12|0|12|1|2|3|30000|m|30000|messages|9")
	f.Add("2|20|1767000000123456|0|532007|0|0|0|0|0|0|0||||7")
	f.Add("1|15|1767000000123456|201000|532007|12|6|12|1|2|3|30000|%|30000,,0")
	f.Add("1|0|1|0|0|0|0|0|0|0|0|0|%7C%25%7|")
	f.Fuzz(func(t *testing.T, in string) {
		got, err := Parse(in)
		if err != nil {
			return
		}
		if len(got.Gaps) > MaxGaps || len(got.ResponseModel) > MaxModel || got.E2E > maxDuration || got.TTFT < 0 ||
			got.ContentEvents > maxCount || got.Start.UnixMicro() <= 0 {
			t.Fatalf("out of bounds: %+v", got)
		}
		again, err := Parse(got.Encode())
		if err != nil {
			t.Fatalf("re-encoded %q: %v", got.Encode(), err)
		}
		if !reflect.DeepEqual(again, got) {
			t.Fatalf("re-encoded differs:\n got %+v\nwant %+v", again, got)
		}
	})
}
