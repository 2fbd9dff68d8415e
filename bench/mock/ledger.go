package mock

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The ledger is what the pool generated, per account a request names in
// its x-mock-ledger header: the truth a gateway's budget is checked
// against. A request is booked when its handler ends (a background
// Responses request when its generation ends), with
//
//   - the prompt tokens it was admitted with (none for a request that left
//     while queued, nor for count_tokens, which runs no model), and
//   - the output tokens decoded until it finished or the client (or the
//     gateway) hung up: every content event whose deadline passed, whether
//     or not its bytes reached anyone. A non-streamed request that is
//     cancelled has decoded the events due before the hang-up although its
//     body was never sent.
//
// GET /mock/ledger returns the accounts as JSON; Server.Ledger in-process.
// Requests without the header are not booked.
const ledgerHeader = "x-mock-ledger"

// Bounds on what a client can make the ledger store.
const (
	maxLedgerAccounts = 1 << 16
	maxLedgerName     = 128
	ledgerOverflow    = "(overflow)" // the account of names past the bounds
)

// LedgerAccount is one account of the ledger.
type LedgerAccount struct {
	Requests     int64 `json:"requests"`      // booked requests
	Open         int64 `json:"open"`          // requests still running (not yet booked)
	PromptTokens int64 `json:"prompt_tokens"` // prompt tokens of the booked requests
	OutputTokens int64 `json:"output_tokens"` // output tokens decoded for them
}

// Tokens is the account's prompt and output tokens.
func (a LedgerAccount) Tokens() int64 { return a.PromptTokens + a.OutputTokens }

type ledger struct {
	mu       sync.Mutex
	accounts map[string]*LedgerAccount
}

// open starts booking a request named by h, or returns nil when h names
// no account.
func (l *ledger) open(h http.Header) *ledgerEntry {
	name := h.Get(ledgerHeader)
	if name == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.accounts == nil {
		l.accounts = map[string]*LedgerAccount{}
	}
	a := l.accounts[name]
	if a == nil {
		if len(name) > maxLedgerName || len(l.accounts) >= maxLedgerAccounts {
			name = ledgerOverflow
		}
		if a = l.accounts[name]; a == nil {
			a = &LedgerAccount{}
			l.accounts[name] = a
		}
	}
	a.Open++
	return &ledgerEntry{l: l, account: a}
}

// ledgerEntry books one request once.
type ledgerEntry struct {
	l       *ledger
	account *LedgerAccount
}

// book closes the entry with what c's generation used.
func (e *ledgerEntry) book(c *completion) {
	if e == nil {
		return
	}
	e.l.mu.Lock()
	defer e.l.mu.Unlock()
	e.account.Open--
	e.account.Requests++
	e.account.PromptTokens += int64(c.prompted)
	e.account.OutputTokens += int64(min(c.decoded, c.outputTokens) * c.choices)
}

// Ledger returns a copy of every account.
func (s *Server) Ledger() map[string]LedgerAccount {
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	out := make(map[string]LedgerAccount, len(s.ledger.accounts))
	for name, a := range s.ledger.accounts {
		out[name] = *a
	}
	return out
}

// LedgerAccount returns one account, and false before its first request.
func (s *Server) LedgerAccount(name string) (LedgerAccount, bool) {
	s.ledger.mu.Lock()
	defer s.ledger.mu.Unlock()
	if a := s.ledger.accounts[name]; a != nil {
		return *a, true
	}
	return LedgerAccount{}, false
}

func (s *Server) handleLedger(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Ledger())
}

// decodedBy counts the output tokens of the content events from event
// `from` on (the first at base, the rest one ITL apart, as Server.play
// skips them) whose deadline had passed at now, added to the tokens of the
// events before `from`: what a request that skipped its intermediate
// events had decoded when it was cancelled.
func (c *completion) decodedBy(now time.Time, from int, base time.Time) int {
	events := from
	for k := from; k < c.events(); k++ {
		if c.sched.jittered(k, base.Add(time.Duration(k-from)*c.sched.itl)).After(now) {
			break
		}
		events = k + 1
	}
	return min(events*c.tokensPerEvent, c.outputTokens)
}

// Background Responses (background: true) answer at once with the queued
// response and no usage, as OpenAI's do, and keep generating after the
// answer has left: the handler stays with the generation until it ends,
// so the ledger books it whole.
func (s *Server) background(w http.ResponseWriter, c *completion, t *ticket) int {
	queued := c.response("queued", "")
	status := writeJSON(w, http.StatusOK, queued)
	if err := http.NewResponseController(w).Flush(); err != nil {
		s.logger.Debug("mock: flushing a background answer", "id", c.id, "err", err)
	}
	// Nobody waits for the rest: nothing can cancel it.
	if _, err := s.play(context.Background(), c, t, nil, func() error { return nil }); err != nil {
		s.clientGone(c, 0, err)
	}
	return status
}

// promptLogprobs is vLLM's prompt_logprobs (and prompt_token_ids), which
// it writes after usage in a non-streamed answer: per prompt token, its n
// most likely tokens (null for the first).
func (c *completion) promptLogprobs() any {
	if c.promptLogprobsN <= 0 {
		return nil
	}
	type logprob struct {
		Logprob      float64 `json:"logprob"`
		Rank         int     `json:"rank"`
		DecodedToken string  `json:"decoded_token"`
	}
	out := make([]map[string]logprob, c.promptTokens)
	words := c.words()
	for i := 1; i < c.promptTokens; i++ {
		m := make(map[string]logprob, c.promptLogprobsN)
		for r := range c.promptLogprobsN {
			m[strconv.Itoa(1000+r)] = logprob{Logprob: -float64(r+1) / 4, Rank: r + 1, DecodedToken: words.next(1)}
		}
		out[i] = m
	}
	return out
}
