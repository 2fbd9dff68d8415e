// Package spend is the spend ledger: what the budgets charged, by hour,
// tenant, team, key and model, and the reports the spend page and
// `infergate spend` print.
//
// It is fed at settlement (Ledger.Charged, admission's SpendRecorder), with
// what the limiter was charged: the settled usage when the meter had proof,
// else the reservation kept. So the page agrees with the budgets by
// construction. The aggregation (hour buckets, the cap on a bucket's
// entries, rollups, top-N) is pure, here; a Store keeps the buckets where
// the budgets are counted: in this process (Memory) or in Redis (Redis),
// which every replica shares.
package spend

import (
	"cmp"
	"encoding/json"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/infergate/infergate/internal/price"
)

// Key is who spent, on what: the tenant the gate identified, the key's
// team (its "team" label, "" when none), the key id or JWT subject, and the
// model the client asked for.
type Key struct {
	Tenant string `json:"tenant,omitempty"`
	Team   string `json:"team,omitempty"`
	KeyID  string `json:"key,omitempty"`
	Model  string `json:"model,omitempty"`
}

// Other stands for every key a full bucket had no room for.
const Other = "(other)"

// OtherKey is where a full bucket folds the keys it has no room for.
var OtherKey = Key{Tenant: Other, Team: Other, KeyID: Other, Model: Other}

// MaxField bounds each of a Key's fields, in bytes.
const MaxField = 128

// Bounded is k as it may be stored: each field valid UTF-8, without
// control characters (a Store's separators), at most MaxField bytes. A
// model name is the client's to choose: nothing of it is stored unbounded.
func (k Key) Bounded() Key {
	return Key{Tenant: boundField(k.Tenant), Team: boundField(k.Team), KeyID: boundField(k.KeyID), Model: boundField(k.Model)}
}

func boundField(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) <= MaxField {
		return s
	}
	cut := MaxField
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Amount is what was charged: requests, tokens (InputTokens counts the
// cached ones too, as the APIs' usage does) and the cost in pico-units of
// the prices' currency (price.Price.Cost).
type Amount struct {
	Requests     int64 `json:"requests"`
	InputTokens  int64 `json:"input_tokens"`
	CachedTokens int64 `json:"cached_input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	Cost         int64 `json:"cost_pico"`
}

// Add is a + b, each part held to int64's range rather than wrapping.
func (a Amount) Add(b Amount) Amount {
	return Amount{Requests: sat(a.Requests, b.Requests), InputTokens: sat(a.InputTokens, b.InputTokens),
		CachedTokens: sat(a.CachedTokens, b.CachedTokens), OutputTokens: sat(a.OutputTokens, b.OutputTokens),
		Cost: sat(a.Cost, b.Cost)}
}

func sat(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// MarshalJSON adds the cost as a decimal amount ("cost": "0.0012").
func (a Amount) MarshalJSON() ([]byte, error) {
	type plain Amount
	return json.Marshal(struct {
		plain
		Cost string `json:"cost"`
	}{plain(a), price.FormatCost(a.Cost)})
}

// Hour is the hour bucket t falls in: Unix hours, UTC.
func Hour(t time.Time) int64 { return floorDiv(t.Unix(), 3600) }

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// HourTime is the start of hour h.
func HourTime(h int64) time.Time { return time.Unix(h*3600, 0).UTC() }

// Bucket is one hour's spend, by key.
type Bucket map[Key]Amount

// Shares bounds the rows (keys) of an hour's bucket, so that no tenant can
// fill it for the others: the model is the client's to choose (any name
// on a "*" tier), so a key could otherwise make a row per request.
//
//   - PerKey: the rows of one (tenant, team, key), one per model; past it,
//     the key's new models are counted under its own fold row
//     (tenant, team, key, Other).
//   - PerTenant: the rows of one tenant; past it, the tenant's new rows are
//     counted under its own fold row (tenant, Other, Other, Other).
//   - Total: the rows of the bucket, a last-resort memory bound that only
//     many tenants filling their shares at once reach; past it, new rows
//     go to OtherKey.
//
// So a key or a tenant that exhausts its share folds only its own rows,
// and every other tenant's rows are exactly as they would have been. A
// bucket holds at most Total+1 rows, a tenant at most PerTenant+1 (its
// fold), a key at most PerKey+1 (its fold). A zero field means its
// default.
type Shares struct {
	PerKey, PerTenant, Total int
}

// The default shares: a key may use 64 models an hour, a tenant 256 rows;
// a bucket holds 16,384 rows (64 tenants' full shares) of at most ~600
// bytes each (four fields of at most MaxField bytes, an Amount, overhead):
// ~10 MB an hour at worst.
const (
	DefaultRowsPerKey    = 64
	DefaultRowsPerTenant = 256
	DefaultMaxKeys       = 16384
)

// OrDefault is s with each zero field set to its default.
func (s Shares) OrDefault() Shares {
	return Shares{PerKey: cmp.Or(s.PerKey, DefaultRowsPerKey), PerTenant: cmp.Or(s.PerTenant, DefaultRowsPerTenant),
		Total: cmp.Or(s.Total, DefaultMaxKeys)}
}

// Rows is what placing a key needs of a bucket.
type Rows interface {
	// Has reports whether the bucket has a row for k.
	Has(k Key) bool
	// Count is how many rows the bucket has: in all, of k's tenant, and of
	// k's tenant, team and key. A row counts for its own tenant and
	// (tenant, team, key), except OtherKey, which counts only in all.
	Count(k Key) (all, tenant, key int)
}

// Slot is the row k (bounded, Key.Bounded) is counted under in a bucket
// with rows r, within the shares s (zero fields: defaults): k itself when
// the bucket has it or k's key, tenant and the bucket all have room; else
// k's key's fold row, if it exists or the tenant and the bucket have room;
// else the tenant's fold row, if it exists or the bucket has room; else
// OtherKey. Every Store places keys with it (Bucket.Slot, Tally.Add).
func (s Shares) Slot(k Key, r Rows) Key {
	if r.Has(k) {
		return k
	}
	s = s.OrDefault()
	all, tenant, key := r.Count(k)
	room := all < s.Total
	if room && tenant < s.PerTenant && key < s.PerKey {
		return k
	}
	if ko := k.keyFold(); r.Has(ko) || room && tenant < s.PerTenant {
		return ko
	}
	if to := k.tenantFold(); r.Has(to) || room {
		return to
	}
	return OtherKey
}

// keyFold is where k's key counts the models past its share.
func (k Key) keyFold() Key { return Key{Tenant: k.Tenant, Team: k.Team, KeyID: k.KeyID, Model: Other} }

// tenantFold is where k's tenant counts the rows past its share.
func (k Key) tenantFold() Key { return Key{Tenant: k.Tenant, Team: Other, KeyID: Other, Model: Other} }

// Has implements Rows.
func (b Bucket) Has(k Key) bool { _, ok := b[k]; return ok }

// Count implements Rows, in time proportional to len(b): a store that
// keeps its buckets in memory keeps a Tally instead.
func (b Bucket) Count(k Key) (all, tenant, key int) {
	for r := range b {
		if r == OtherKey {
			continue
		}
		if r.Tenant == k.Tenant {
			tenant++
			if r.Team == k.Team && r.KeyID == k.KeyID {
				key++
			}
		}
	}
	return len(b), tenant, key
}

// Slot is the row k is counted under in b within s: Shares.Slot.
func (b Bucket) Slot(k Key, s Shares) Key { return s.Slot(k, b) }

// Tally is a Bucket with its rows counted, so that Add places a key in
// constant time. The zero Tally is empty and ready to use.
type Tally struct {
	b       Bucket
	tenants map[string]int
	keys    map[Key]int // by (tenant, team, key), Model ""
}

// Has implements Rows.
func (t *Tally) Has(k Key) bool { return t.b.Has(k) }

// Count implements Rows.
func (t *Tally) Count(k Key) (all, tenant, key int) {
	return len(t.b), t.tenants[k.Tenant], t.keys[Key{Tenant: k.Tenant, Team: k.Team, KeyID: k.KeyID}]
}

// Add counts a (Amount.Add: saturating) under the row Shares.Slot gives k
// (bounded first), and returns that row.
func (t *Tally) Add(k Key, a Amount, s Shares) Key {
	slot := s.Slot(k.Bounded(), t)
	if t.b == nil {
		t.b, t.tenants, t.keys = Bucket{}, map[string]int{}, map[Key]int{}
	}
	if !t.b.Has(slot) && slot != OtherKey {
		t.tenants[slot.Tenant]++
		t.keys[Key{Tenant: slot.Tenant, Team: slot.Team, KeyID: slot.KeyID}]++
	}
	t.b[slot] = t.b[slot].Add(a)
	return slot
}

// Bucket is a copy of the tally's bucket.
func (t *Tally) Bucket() Bucket { return maps.Clone(t.b) }

// Dimension is one of a Key's fields a report groups by.
type Dimension string

const (
	ByTenant Dimension = "tenant"
	ByTeam   Dimension = "team"
	ByKey    Dimension = "key"
	ByModel  Dimension = "model"
)

// Dimensions are every Dimension, in a report's column order.
var Dimensions = []Dimension{ByTenant, ByTeam, ByKey, ByModel}

// project keeps k's fields named in by, blanks the rest.
func project(k Key, by []Dimension) Key {
	var p Key
	for _, d := range by {
		switch d {
		case ByTenant:
			p.Tenant = k.Tenant
		case ByTeam:
			p.Team = k.Team
		case ByKey:
			p.KeyID = k.KeyID
		case ByModel:
			p.Model = k.Model
		}
	}
	return p
}

// Query is what a report covers: the hours from Since's up to Until
// (exclusive), grouped by By (none: one row, the total). Each row's
// spend today and this month is as of Now (zero: Until), whatever the
// window, so that last month's report still says what today cost.
type Query struct {
	Since, Until, Now time.Time
	By                []Dimension
}

// now is q's Now, or its Until when unset.
func (q Query) now() time.Time {
	if q.Now.IsZero() {
		return q.Until.UTC()
	}
	return q.Now.UTC()
}

// lastHour is the last hour q's window covers: Until's, unless Until
// starts an hour (the window ends before it) in the past; a window that
// reaches Now covers Now's hour so far.
func (q Query) lastHour() int64 {
	if !q.Until.Before(q.now()) {
		return Hour(q.Until)
	}
	return Hour(q.Until.Add(-time.Nanosecond))
}

// LastHour is the latest hour a report of q needs: its window's, or Now's
// when later (Rows carry today's spend).
func LastHour(q Query) int64 { return max(q.lastHour(), Hour(q.now())) }

// Retention is how long a bucket is kept: the whole of last month on the
// last day of this one (62 days: July and August are 31 days each).
const Retention = 62 * 24 * time.Hour

// MaxSince is the longest window a report covers: Retention.
const MaxSince = Retention

// Report is a Query's answer.
type Report struct {
	Since time.Time `json:"since"`
	// Until is the end of the window, exclusive.
	Until    time.Time   `json:"until"`
	By       []Dimension `json:"by"`
	Currency string      `json:"currency,omitempty"`
	// Total is the window's spend.
	Total Amount `json:"total"`
	// Rows are the window's spend by the query's dimensions, the largest
	// cost first, each with its spend today and this calendar month (UTC).
	Rows []Row `json:"rows"`
	// TopModels are the models that cost most over the window (at most
	// TopN).
	TopModels []Row `json:"top_models"`
	// Hours are the window's spend per hour, every hour of it, oldest first.
	Hours []HourSpend `json:"hours"`
	// Budgets are what each budget had left at this replica's last
	// admission under it (Ledger.Reserved).
	Budgets []BudgetLeft `json:"budgets"`
}

// Row is one group's spend.
type Row struct {
	Key
	// KeyName and KeyOwner are the key's name and owner in the keys file
	// (Ledger.KeyInfo), when grouped by key: read at report time, never
	// stored in the ledger.
	KeyName  string `json:"key_name,omitempty"`
	KeyOwner string `json:"key_owner,omitempty"`
	Window   Amount `json:"window"`
	Today    Amount `json:"today"`
	Month    Amount `json:"month"`
}

// HourSpend is one hour's spend.
type HourSpend struct {
	Hour time.Time `json:"hour"`
	Amount
}

// MaxRows bounds a report's rows: the smallest past it are summed into
// one, (other) in every dimension.
const MaxRows = 500

// TopN bounds a report's top models.
const TopN = 10

// FirstHour is the earliest hour a report of q needs: its window's, or the
// month's start when that is earlier (Rows carry the month's spend).
func FirstHour(q Query) int64 {
	n := q.now()
	month := time.Date(n.Year(), n.Month(), 1, 0, 0, 0, 0, time.UTC)
	return min(Hour(q.Since), Hour(month))
}

// Build makes q's report from the buckets by hour (those from FirstHour(q)
// to LastHour(q); others are ignored).
func Build(q Query, hours map[int64]Bucket) Report {
	n := q.now()
	first, last, now := Hour(q.Since), q.lastHour(), Hour(n)
	today := Hour(time.Date(n.Year(), n.Month(), n.Day(), 0, 0, 0, 0, time.UTC))
	month := Hour(time.Date(n.Year(), n.Month(), 1, 0, 0, 0, 0, time.UTC))
	r := Report{Since: HourTime(first), Until: q.Until.UTC(), By: q.By, Rows: []Row{}, TopModels: []Row{}}
	rows := map[Key]*Row{}
	models := map[string]*Row{}
	for h := first; h <= last; h++ {
		var hs Amount
		for _, a := range hours[h] {
			hs = hs.Add(a)
		}
		r.Hours = append(r.Hours, HourSpend{Hour: HourTime(h), Amount: hs})
		r.Total = r.Total.Add(hs)
	}
	for h, b := range hours {
		if h > max(last, now) || h < min(first, month) {
			continue
		}
		for k, a := range b {
			g := project(k, q.By)
			row := rows[g]
			if row == nil {
				row = &Row{Key: g}
				rows[g] = row
			}
			if h >= first && h <= last {
				row.Window = row.Window.Add(a)
				m := models[k.Model]
				if m == nil {
					m = &Row{Key: Key{Model: k.Model}}
					models[k.Model] = m
				}
				m.Window = m.Window.Add(a)
			}
			if h >= today && h <= now {
				row.Today = row.Today.Add(a)
			}
			if h >= month && h <= now {
				row.Month = row.Month.Add(a)
			}
		}
	}
	for _, row := range rows {
		if row.Window != (Amount{}) || row.Today != (Amount{}) || row.Month != (Amount{}) {
			r.Rows = append(r.Rows, *row)
		}
	}
	slices.SortFunc(r.Rows, byCost(func(r Row) Amount { return r.Window }))
	if len(r.Rows) > MaxRows {
		rest := Row{Key: project(OtherKey, q.By)}
		for _, row := range r.Rows[MaxRows-1:] {
			rest.Window, rest.Today, rest.Month = rest.Window.Add(row.Window), rest.Today.Add(row.Today), rest.Month.Add(row.Month)
		}
		r.Rows = append(r.Rows[:MaxRows-1], rest)
	}
	for _, m := range models {
		if m.Window != (Amount{}) {
			r.TopModels = append(r.TopModels, *m)
		}
	}
	slices.SortFunc(r.TopModels, byCost(func(r Row) Amount { return r.Window }))
	r.TopModels = r.TopModels[:min(len(r.TopModels), TopN)]
	return r
}

// byCost orders rows by cost, then requests, largest first, then by key.
func byCost(of func(Row) Amount) func(a, b Row) int {
	return func(a, b Row) int {
		return cmp.Or(cmp.Compare(of(b).Cost, of(a).Cost), cmp.Compare(of(b).Requests, of(a).Requests),
			cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Team, b.Team),
			cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Model, b.Model))
	}
}

// ParseBy reads a comma-separated list of dimensions ("tenant,model").
func ParseBy(s string) ([]Dimension, error) {
	var by []Dimension
	for f := range strings.SplitSeq(s, ",") {
		d := Dimension(strings.TrimSpace(f))
		switch {
		case d == "":
			continue
		case !slices.Contains(Dimensions, d):
			return nil, &QueryError{"by: " + string(d) + " is not one of tenant, team, key, model"}
		case slices.Contains(by, d):
			continue
		}
		by = append(by, d)
	}
	slices.SortFunc(by, func(a, b Dimension) int {
		return cmp.Compare(slices.Index(Dimensions, a), slices.Index(Dimensions, b))
	})
	return by, nil
}

// ParseSince reads a window's length: a Go duration ("24h", "90m") or a
// number of days ("7d"), positive, at most MaxSince.
func ParseSince(s string) (time.Duration, error) {
	var d time.Duration
	var err error
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err = time.ParseDuration(n + "h")
		d *= 24
	} else {
		d, err = time.ParseDuration(s)
	}
	if err != nil || d <= 0 || d > MaxSince {
		return 0, &QueryError{"since: " + s + " is not a duration between 1s and 62d (24h, 7d)"}
	}
	return d, nil
}

// QueryError is a query a report cannot answer.
type QueryError struct{ msg string }

func (e *QueryError) Error() string { return e.msg }
