package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/infergate/infergate/internal/config"
	"github.com/infergate/infergate/internal/flagset"
	"github.com/infergate/infergate/internal/identity"
	"github.com/infergate/infergate/internal/price"
)

const keysUsage = `Manage the API keys of a keys file (auth.keys), or of a Kubernetes Secret
holding one: a key is printed once, at creation, and only its SHA-256 is
written; the gate reloads the keys without a restart.

Usage:
  infergate keys create --tenant T [--team T] [--tier T] [--name TEXT] [--owner WHO] [--expires 30d] [--budget-month 500] [--id ID] WHERE
  infergate keys list   [--admin URL]... [--admin-token-file F] [--json] WHERE
  infergate keys revoke ID WHERE
  infergate keys rotate ID [--grace 24h] WHERE

WHERE is --file F (default keys.yaml), --config F (its auth.keys) or --secret NAMESPACE/NAME [--secret-key keys.yaml].
`

// keysNow is the clock of the keys subcommands (tests pin it).
var keysNow = time.Now

// runKeys runs `infergate keys SUBCOMMAND`.
func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, keysUsage)
		return ErrUsage
	}
	sub, rest := args[0], args[1:]
	// revoke and rotate take the id first: flag stops at a non-flag.
	var id string
	if sub == "revoke" || sub == "rotate" {
		if len(rest) > 0 && (rest[0] == "-h" || rest[0] == "--help" || rest[0] == "-help") {
			fmt.Fprint(stderr, keysUsage) // as every subcommand's --help: a clean exit
			return flag.ErrHelp
		}
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			fmt.Fprintf(stderr, "infergate keys %s: the key's id comes first (see infergate keys list)\n", sub)
			return ErrUsage
		}
		id, rest = rest[0], rest[1:]
	}
	fs := flagset.New("keys "+sub, "", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, keysUsage+"\nFlags:\n"); fs.PrintDefaults() }
	file := fs.String("file", "keys.yaml", "the keys file (auth.keys) to edit; created when missing")
	secret := fs.String("secret", "", "edit the keys in this Kubernetes Secret, NAMESPACE/NAME (the chart's apiKeys.existingSecret), instead of --file; created when missing; the cluster is KUBECONFIG's, ~/.kube/config's or the pod's")
	secretKey := fs.String("secret-key", "keys.yaml", "the Secret's data key holding the keys file")
	configFile := fs.String("config", "", "take the keys file from this config file's auth.keys instead of --file")
	store := func() (keyStore, error) {
		if *configFile != "" {
			explicit := false
			fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "file" || f.Name == "secret" })
			if explicit {
				fmt.Fprintf(stderr, "infergate keys %s: --config or --file/--secret, not both\n", sub)
				return nil, ErrUsage
			}
			cfg, err := config.Load(*configFile)
			if err != nil {
				return nil, err
			}
			if cfg.Auth.Keys == "" {
				return nil, fmt.Errorf("%s sets no auth.keys: set it to the keys file (or use --file)", *configFile)
			}
			*file = cfg.Auth.Keys
		}
		if *secret == "" {
			return fileStore(*file), nil
		}
		return newSecretStore(*secret, *secretKey)
	}
	now := keysNow().UTC().Truncate(time.Second)
	switch sub {
	case "create":
		tenant := fs.String("tenant", "", "the tenant whose budget the key spends (required)")
		team := fs.String("team", "", "label team (policies see it)")
		tier := fs.String("tier", "", "label tier (policies see it)")
		name := fs.String("name", "", "what the key is for, e.g. \"search backend\" (shown by list and the spend page)")
		owner := fs.String("owner", "", "who holds the key, e.g. alice@acme.example (shown by list and the spend page)")
		expires := fs.String("expires", "", "lifetime, e.g. 30d or 12h (default: none)")
		keyID := fs.String("id", "", "the key's id (default: TENANT-<8 random hex digits>)")
		budget := fs.String("budget-month", "", "the key's own budget per calendar month (UTC), a decimal amount of the prices' currency (prices.currency), e.g. 500; policies see it as input.principal.budget_month")
		// The flag's first name said dollars whatever the currency: still read.
		fs.Var(stringAlias{budget}, "budget-usd-month", "the same as --budget-month (its former name)")
		if err := flagset.Parse(fs, rest); err != nil {
			return err
		}
		if *budget != "" {
			if _, err := price.ParseAmount(*budget); err != nil {
				fmt.Fprintf(stderr, "infergate keys create: --budget-month %v\n", err)
				return ErrUsage
			}
		}
		if *tenant == "" {
			fmt.Fprintln(stderr, "infergate keys create: --tenant is required")
			return ErrUsage
		}
		for flag, v := range map[string]string{"name": *name, "owner": *owner} {
			if err := identity.CheckText(flag, v); err != nil {
				fmt.Fprintf(stderr, "infergate keys create: --%v\n", err)
				return ErrUsage
			}
		}
		e := identity.KeyEntry{ID: *keyID, Tenant: *tenant, Name: *name, Owner: *owner, Created: &now, BudgetMonth: *budget}
		if e.ID == "" {
			e.ID = identity.NewKeyID(*tenant)
		}
		for k, v := range map[string]string{"team": *team, "tier": *tier} {
			if v != "" {
				if e.Labels == nil {
					e.Labels = map[string]string{}
				}
				e.Labels[k] = v
			}
		}
		if *expires != "" {
			d, err := identity.ParseExpiry(*expires)
			if err != nil {
				fmt.Fprintf(stderr, "infergate keys create: --expires %v\n", err)
				return ErrUsage
			}
			at := now.Add(d)
			e.Expires = &at
		}
		st, err := store()
		if err != nil {
			return err
		}
		return mint(ctx, st, e, nil, stdout, stderr)
	case "rotate":
		grace := fs.Duration("grace", 24*time.Hour, "how long the old key stays valid beside the new one")
		if err := flagset.Parse(fs, rest); err != nil {
			return err
		}
		if *grace < 0 {
			fmt.Fprintln(stderr, "infergate keys rotate: --grace must not be negative")
			return ErrUsage
		}
		st, err := store()
		if err != nil {
			return err
		}
		return rotate(ctx, st, id, now, *grace, stdout, stderr)
	case "revoke":
		if err := flagset.Parse(fs, rest); err != nil {
			return err
		}
		st, err := store()
		if err != nil {
			return err
		}
		return revoke(ctx, st, id, now, stderr)
	case "list":
		var admins []string
		fs.Func("admin", "an admin URL (http://HOST:9090) of a replica to read last use from (GET /debug/keys); repeat it for each replica", func(s string) error {
			admins = append(admins, strings.TrimRight(s, "/"))
			return nil
		})
		tokenFile := fs.String("admin-token-file", "", "the bearer token of admin.debug.tokenFile, when set")
		asJSON := fs.Bool("json", false, "print JSON instead of a table")
		if err := flagset.Parse(fs, rest); err != nil {
			return err
		}
		st, err := store()
		if err != nil {
			return err
		}
		if f, ok := st.(fileStore); ok {
			// Only create makes a file: listing one that is not there is
			// a typo, not an empty set of keys.
			if _, err := os.Stat(string(f)); err != nil {
				return fmt.Errorf("infergate keys list: %w (infergate keys create --file %s makes one)", err, f)
			}
		}
		return list(ctx, st, admins, *tokenFile, *asJSON, stdout)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, keysUsage)
		return nil
	}
	fmt.Fprintf(stderr, "infergate keys: unknown subcommand %q\n\n%s", sub, keysUsage)
	return ErrUsage
}

// keyStore is where the keys commands read and write a keys file.
type keyStore interface {
	// edit applies fn to the keys and writes them back, checked; fn may
	// run again when the store changed meanwhile (nothing is written
	// then), so it must not print.
	edit(ctx context.Context, fn func(*identity.KeyFileEdit) error) error
	read(ctx context.Context) (*identity.KeyFileEdit, error)
	String() string
}

// fileStore is a keys file, replaced atomically (a gate may be reloading
// it); two commands editing it at once: the last one wins.
type fileStore string

func (f fileStore) String() string { return string(f) }

func (f fileStore) read(context.Context) (*identity.KeyFileEdit, error) {
	return identity.OpenKeyFile(string(f))
}

func (f fileStore) edit(ctx context.Context, fn func(*identity.KeyFileEdit) error) error {
	kf, err := f.read(ctx)
	if err != nil {
		return err
	}
	if err := fn(kf); err != nil {
		return noChange(err)
	}
	return kf.Save()
}

// errNoChange from an edit's fn: nothing to write.
var errNoChange = errors.New("no change")

func noChange(err error) error {
	if errors.Is(err, errNoChange) {
		return nil
	}
	return err
}

// mint adds e with a new key to the store (after edit, when given, has
// changed it too) and prints the key, once, to stdout.
func mint(ctx context.Context, st keyStore, e identity.KeyEntry, edit func(*identity.KeyFileEdit) error, stdout, stderr io.Writer) error {
	key, sha := identity.NewKey()
	e.SHA256 = sha
	err := st.edit(ctx, func(f *identity.KeyFileEdit) error {
		if _, i, err := f.Find(e.ID); err != nil {
			return err
		} else if i >= 0 {
			return fmt.Errorf("%s: a key with id %q exists", st, e.ID)
		}
		if edit != nil {
			if err := edit(f); err != nil {
				return err
			}
		}
		return f.Append(e)
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, key)
	fmt.Fprintf(stderr, "key %s of tenant %s written to %s; the key above is shown this once\n", e.ID, e.Tenant, st)
	return nil
}

// find is the entry of id and its index in f.
func find(st keyStore, f *identity.KeyFileEdit, id string) (identity.KeyEntry, int, error) {
	e, i, err := f.Find(id)
	if err == nil && i < 0 {
		err = fmt.Errorf("%s: no key with id %q", st, id)
	}
	return e, i, err
}

// rotate mints a key with the attributes of id (and as long a lifetime,
// when id had one and its creation time is known; else none) and ends id's
// validity grace from now (or at its own expiry, if sooner).
func rotate(ctx context.Context, st keyStore, id string, now time.Time, grace time.Duration, stdout, stderr io.Writer) error {
	f, err := st.read(ctx)
	if err != nil {
		return err
	}
	old, _, err := find(st, f, id)
	if err != nil {
		return err
	}
	e := identity.KeyEntry{ID: identity.NewKeyID(old.Tenant), Tenant: old.Tenant, Labels: old.Labels, Name: old.Name, Owner: old.Owner, Created: &now,
		BudgetMonth: old.BudgetMonth}
	if old.Expires != nil && old.Created != nil {
		at := now.Add(old.Expires.Sub(*old.Created))
		e.Expires = &at
	}
	end := now.Add(grace)
	if old.Expires != nil && old.Expires.Before(end) {
		end = *old.Expires
	}
	err = mint(ctx, st, e, func(f *identity.KeyFileEdit) error {
		old, i, err := find(st, f, id) // again: the store may have changed
		switch {
		case err != nil:
			return err
		case old.Revoked != nil:
			return fmt.Errorf("key %s is revoked: create a new one", id)
		case old.RotatedTo != "":
			return fmt.Errorf("key %s was already rotated, to %s", id, old.RotatedTo)
		case old.Expires != nil && !now.Before(*old.Expires):
			return fmt.Errorf("key %s expired at %s: create a new one", id, old.Expires.UTC().Format(time.RFC3339))
		}
		f.SetTime(i, "expires", end)
		f.SetString(i, "rotatedTo", e.ID)
		return nil
	}, stdout, stderr)
	if err == nil {
		fmt.Fprintf(stderr, "key %s stays valid until %s\n", id, end.Format(time.RFC3339))
	}
	return err
}

// revoke marks id revoked from now.
func revoke(ctx context.Context, st keyStore, id string, now time.Time, stderr io.Writer) error {
	var already *time.Time
	err := st.edit(ctx, func(f *identity.KeyFileEdit) error {
		old, i, err := find(st, f, id)
		if err != nil {
			return err
		}
		if already = old.Revoked; already != nil {
			return errNoChange
		}
		f.SetTime(i, "revoked", now)
		return nil
	})
	switch {
	case err != nil:
		return err
	case already != nil:
		fmt.Fprintf(stderr, "key %s was revoked at %s already\n", id, already.UTC().Format(time.RFC3339))
	default:
		fmt.Fprintf(stderr, "key %s revoked in %s; the gate refuses it once it has reloaded the keys\n", id, st)
	}
	return nil
}

// maxKeysStatus bounds an admin's answer to GET /debug/keys.
const maxKeysStatus = 64 << 20

// list prints the file's keys (never a key or a hash), with the latest
// last use the admins report.
func list(ctx context.Context, st keyStore, admins []string, tokenFile string, asJSON bool, stdout io.Writer) error {
	f, err := st.read(ctx)
	if err != nil {
		return err
	}
	entries, err := f.Entries()
	if err != nil {
		return err
	}
	lastUsed := map[string]time.Time{}
	for _, url := range admins {
		st, err := fetchKeyStatus(ctx, url, tokenFile)
		if err != nil {
			return err
		}
		for _, s := range st {
			if s.LastUsed != nil && s.LastUsed.After(lastUsed[s.ID]) {
				lastUsed[s.ID] = *s.LastUsed
			}
		}
	}
	rows := make([]identity.KeyStatus, len(entries))
	for i, e := range entries {
		e.SHA256 = ""
		rows[i].KeyEntry = e
		if t, ok := lastUsed[e.ID]; ok {
			rows[i].LastUsed = &t
		}
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tTENANT\tTEAM\tTIER\tOWNER\tCREATED\tEXPIRES\tREVOKED\tLAST USE")
	for _, r := range rows {
		lastUse := "-"
		switch {
		case r.LastUsed != nil:
			lastUse = r.LastUsed.UTC().Format(time.RFC3339)
		case len(admins) == 0:
			lastUse = "(--admin)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, dash(r.Name), r.Tenant, dash(r.Labels["team"]), dash(r.Labels["tier"]),
			dash(r.Owner), when(r.Created), when(r.Expires), when(r.Revoked), lastUse)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func when(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// fetchKeyStatus reads GET /debug/keys of one replica's admin port.
func fetchKeyStatus(ctx context.Context, url, tokenFile string) ([]identity.KeyStatus, error) {
	body, err := getAdmin(ctx, url+"/debug/keys", tokenFile, maxKeysStatus,
		"the admin port serves it with admin.debug.enabled and auth.keys")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	var st []identity.KeyStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return nil, fmt.Errorf("%s/debug/keys: %w", url, err)
	}
	return st, nil
}

// stringAlias is a second name of a string flag.
type stringAlias struct{ p *string }

func (a stringAlias) String() string {
	if a.p == nil {
		return ""
	}
	return *a.p
}
func (a stringAlias) Set(s string) error { *a.p = s; return nil }
