package cli

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/compose"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/ratelimit"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/spend"
)

// `infergate spend` reads the admin port's report behind its debug token
// and prints it as a table; a bad window or grouping is a usage error
// before anything is asked.
func TestSpendCommand(t *testing.T) {
	prices := &price.Table{Currency: "USD"}
	prices.Add("m1", price.Price{Input: 1_000_000, Output: 2_000_000}, nil)
	now := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	l := &spend.Ledger{Store: &spend.Memory{}, Prices: prices, Now: func() time.Time { return now },
		KeyInfo: func(id string) (string, string) { return "search backend", "alice@acme.example" }}
	l.Charged(context.Background(), "acme", &request.Settlement{Model: "m1", Principal: "k1"},
		ratelimit.Cost{Requests: 1, InputTokens: 1000, OutputTokens: 500}, true)
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("s3cret\n"), 0o600)
	srv := httptest.NewServer(compose.Bearer(token, spend.Handler(l)))
	defer srv.Close()

	var out bytes.Buffer
	run := func(args ...string) error {
		out.Reset()
		return Run(context.Background(), append([]string{"spend", "--admin", srv.URL}, args...), &out, &out)
	}
	if err := run("--admin-token-file", token, "--by", "tenant,model"); err != nil {
		t.Fatalf("spend: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "acme    m1     $0.002  1         1000   0       500     $0.002  $0.002\n") {
		t.Errorf("table:\n%s", out.String())
	}
	// A window by dates, grouped by key: the key's name and owner beside it.
	if err := run("--admin-token-file", token, "--from", "2026-12-02", "--to", "2026-12-02", "--by", "key"); err != nil ||
		!strings.Contains(out.String(), "k1     search backend  alice@acme.example  $0.002") ||
		!strings.Contains(out.String(), "Spend from 2026-12-02T00:00:00Z to 2026-12-02T09:00:00Z") {
		t.Errorf("--from --to --by key: %v\n%s", err, out.String())
	}
	if err := run("--admin-token-file", token, "--range", "last-month", "--by", "tenant"); err != nil ||
		!strings.Contains(out.String(), "Spend from 2026-11-01T00:00:00Z to 2026-12-01T00:00:00Z") ||
		!strings.Contains(out.String(), "TOTAL   $0.00") {
		t.Errorf("--range last-month: %v\n%s", err, out.String())
	}
	if err := run("--admin-token-file", token, "--since", "2h", "--by", "tenant,key", "--csv"); err != nil ||
		out.String() != "tenant,key,key_name,key_owner,currency,cost,requests,input_tokens,cached_input_tokens,output_tokens,cost_today,cost_this_month\r\n"+
			"acme,k1,search backend,alice@acme.example,USD,0.002,1,1000,0,500,0.002,0.002\r\n" {
		t.Errorf("--csv: %v\n%q", err, out.String())
	}
	if err := run("--by", "tenant"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without the token: %v, want a 401", err)
	}
	for _, bad := range [][]string{{"--by", "pool"}, {"--since", "90d"}, {"--from", "yesterday"}, {"--range", "year"},
		{"--since", "1h", "--range", "today"}, {"--to", "2026-12-01"}, {"--from", "2026-12-02", "--to", "2026-12-01"}, {"--json", "--csv"}} {
		if err := run(bad...); !errors.Is(err, ErrUsage) {
			t.Errorf("%v: %v, want a usage error", bad, err)
		}
	}
}

// Without a replica where it looks, spend says what to do rather than
// Go's dial error alone; --config reads the admin port from the file and
// refuses one whose /debug pages are off.
func TestSpendWhereTheAdminIs(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	if _, _, err := run(t, "spend", "--admin", "http://"+closed); err == nil || !strings.Contains(err.Error(), "nothing answers at "+closed) {
		t.Errorf("spend at a closed port: %v", err)
	}
	dir := t.TempDir()
	off := filepath.Join(dir, "off.yaml")
	os.WriteFile(off, []byte("admin:\n  listen: "+closed+"\n"), 0o644)
	if _, _, err := run(t, "spend", "--config", off); err == nil || !strings.Contains(err.Error(), "admin.debug.enabled is off") {
		t.Errorf("spend --config with the debug pages off: %v", err)
	}
	on := filepath.Join(dir, "on.yaml")
	os.WriteFile(on, []byte("admin:\n  listen: "+closed+"\n  debug:\n    enabled: true\n"), 0o644)
	if _, _, err := run(t, "spend", "--config", on); err == nil || !strings.Contains(err.Error(), "nothing answers at "+closed) {
		t.Errorf("spend --config: %v, want it to dial the config's admin.listen", err)
	}
}
