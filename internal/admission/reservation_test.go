package admission

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/infergate/infergate/internal/ratelimit"
)

// The reservation codec writes what encoding/json writes and reads it back.
func TestReservationCodec(t *testing.T) {
	for _, r := range []ratelimit.Reservation{
		{},
		{Entries: []ratelimit.Entry{}},
		{Entries: []ratelimit.Entry{{Counter: "tenant=acme/principal=k|requests|60000|1700000000000", Unit: ratelimit.Requests, Reserved: 1, ExpiresAt: 1700000060000}}},
		{Entries: []ratelimit.Entry{
			{Counter: `tenant=a/model="q\uote" <&> é` + "\x01", Unit: ratelimit.TotalTokens, Reserved: 1 << 40, ExpiresAt: -1},
			{Counter: "", Unit: ratelimit.OutputTokens, Reserved: 0, ExpiresAt: 0},
		}},
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
		var std ratelimit.Reservation
		json.Unmarshal(want, &std)
		if !reflect.DeepEqual(back, std) {
			t.Errorf("decoded %+v, want %+v", back, std)
		}
	}
	for _, bad := range []string{"", "[]", `{"e":3}`, `{"e":[{"k":1,"u":"requests","r":1,"x":1}]}`, `{"e":[{"k":"a"}]}`, `{"e":[`} {
		if _, err := decodeReservation(bad); err == nil {
			t.Errorf("decoded %q", bad)
		}
	}
}
