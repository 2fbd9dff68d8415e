package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/infergate/infergate/internal/compose"
	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/flagset"
	"github.com/infergate/infergate/internal/price"
	"github.com/infergate/infergate/internal/spend"
)

// maxSpendReport bounds an admin's answer to GET /debug/spend.
const maxSpendReport = 32 << 20

// runSpend runs `infergate spend`: the spend page's report, read from an
// admin port, as a table or JSON.
func runSpend(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flagset.New("spend", "Print what the budgets charged (the admin port's /debug/spend), by tenant, team, key or model,\n"+
		"over a window, with each row's spend today and this month (UTC).", stderr)
	admin := fs.String("admin", "http://127.0.0.1:9090", "the admin URL of a replica (with the Redis backend every replica reports the same ledger)")
	tokenFile := fs.String("admin-token-file", "", "the bearer token of admin.debug.tokenFile, when set")
	since := fs.String("since", "", "the window: a duration back from now (90m, 24h) or days (7d), at most 62d (default: 24h)")
	from := fs.String("from", "", "the window's start: a date (2026-11-01, UTC) or an RFC 3339 time")
	to := fs.String("to", "", "the window's end: a date, through that day (UTC), or an RFC 3339 time (default: now)")
	pick := fs.String("range", "", "a named window: today, 7d, this-month or last-month")
	by := fs.String("by", "tenant,model", "group by any of tenant, team, key, model (comma-separated)")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	asCSV := fs.Bool("csv", false, "print the rows as CSV (the page's export) instead of a table")
	configFile := fs.String("config", "", "read the admin port and its token from this config file (admin.listen, admin.debug.tokenFile) instead of --admin")
	if err := flagset.Parse(fs, args); err != nil {
		return err
	}
	if *configFile != "" {
		cfg, err := config.Load(*configFile)
		if err != nil {
			return err
		}
		if !cfg.Admin.Debug.Enabled {
			return fmt.Errorf("%s: admin.debug.enabled is off, so no replica serves /debug/spend: turn it on", *configFile)
		}
		*admin = "http://" + cfg.Admin.Listen
		if *tokenFile == "" {
			*tokenFile = cfg.Admin.Debug.TokenFile
		}
	}
	q := url.Values{}
	for name, v := range map[string]string{"since": *since, "from": *from, "to": *to, "range": *pick} {
		if v != "" {
			q.Set(name, v)
		}
	}
	dims, err := spend.ParseBy(*by)
	if err == nil {
		// What does not depend on the clock: the replica's decides the rest.
		err = spend.CheckWindow(q)
	}
	if err != nil {
		fmt.Fprintf(stderr, "infergate spend: %v\n", err)
		return ErrUsage
	}
	if *asJSON && *asCSV {
		fmt.Fprintln(stderr, "infergate spend: --json or --csv, not both")
		return ErrUsage
	}
	q.Set("by", byString(dims))
	q.Set("format", "json")
	if *asCSV {
		q.Set("format", "csv")
	}
	body, err := getAdmin(ctx, strings.TrimRight(*admin, "/")+"/debug/spend?"+q.Encode(), *tokenFile, maxSpendReport,
		"the admin port serves it with admin.debug.enabled")
	if err != nil {
		return err
	}
	if *asJSON || *asCSV {
		_, err := stdout.Write(body)
		return err
	}
	var rep spend.Report
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("%s/debug/spend: %w", *admin, err)
	}
	return printSpend(stdout, rep)
}

func byString(by []spend.Dimension) string {
	s := make([]string, len(by))
	for i, d := range by {
		s[i] = string(d)
	}
	return strings.Join(s, ",")
}

// getAdmin GETs url from an admin port, with the debug token if any:
// the body, at most limit bytes, of a 200 answer. hint says what serves
// the page, for the error when it is not served.
func getAdmin(ctx context.Context, url, tokenFile string, limit int64, hint string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if tokenFile != "" {
		token, err := compose.ReadToken(tokenFile)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+string(token))
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("nothing answers at %s: is infergate serving there? point --admin (or --config) at a replica's admin port: %w", req.URL.Host, err)
	}
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return nil, err
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("GET %s: %s: %s (%s)", req.URL.Path, resp.Status, bytes.TrimSpace(body[:min(len(body), 512)]), hint)
	case int64(len(body)) > limit:
		return nil, fmt.Errorf("GET %s: longer than %d bytes", req.URL.Path, limit)
	}
	return body, nil
}

// printSpend writes rep as a table: a row per group (grouped by key, its
// name and owner beside it), then the total; money in the currency, as a
// person reads it (price.Money).
func printSpend(w io.Writer, rep spend.Report) error {
	fmt.Fprintf(w, "Spend from %s to %s (UTC)", rep.Since.UTC().Format(time.RFC3339), rep.Until.UTC().Format(time.RFC3339))
	if rep.Currency != "" {
		fmt.Fprintf(w, ", in %s", rep.Currency)
	}
	fmt.Fprintln(w)
	money := func(pico int64) string { return price.Money(pico, rep.Currency) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var head []string
	for _, d := range rep.By {
		head = append(head, strings.ToUpper(string(d)))
		if d == spend.ByKey {
			head = append(head, "NAME", "OWNER")
		}
	}
	head = append(head, "COST", "REQUESTS", "INPUT", "CACHED", "OUTPUT", "TODAY", "THIS MONTH")
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	line := func(labels []string, a spend.Amount, today, month string) {
		fmt.Fprintf(tw, "%s%s\t%d\t%d\t%d\t%d\t%s\t%s\n", strings.Join(labels, ""), money(a.Cost),
			a.Requests, a.InputTokens, a.CachedTokens, a.OutputTokens, today, month)
	}
	for _, r := range rep.Rows {
		var labels []string
		for _, d := range rep.By {
			labels = append(labels, dash(r.Field(d))+"\t")
			if d == spend.ByKey {
				labels = append(labels, dash(r.KeyName)+"\t", dash(r.KeyOwner)+"\t")
			}
		}
		line(labels, r.Window, money(r.Today.Cost), money(r.Month.Cost))
	}
	var total []string
	for range len(head) - 7 {
		total = append(total, "\t")
	}
	if len(total) > 0 {
		total[0] = "TOTAL\t"
	}
	line(total, rep.Total, "-", "-")
	return tw.Flush()
}
