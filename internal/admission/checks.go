package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/infergate/infergate/internal/openai"
)

// Check is an external HTTP check a policy can require, such as content
// moderation. The request body is POSTed to URL; a 2xx admits, a 4xx
// denies (its JSON "reason" or "message" becomes the error message), and
// anything else — 5xx, timeout, refused connection — is a failure handled
// by OnError. Its time is the stamp's checks_ms, never gateway or model time.
type Check struct {
	Name    string
	URL     string
	Timeout time.Duration
	Allow   bool // on failure: true admits, false answers 503
	Client  *http.Client
	Log     *slog.Logger
}

// NewCheck returns c with an HTTP client of its own when it has none.
func NewCheck(c Check) *Check {
	if c.Client == nil {
		c.Client = &http.Client{Transport: http.DefaultTransport}
	}
	return &c
}

// Run performs the check; nil admits.
func (c *Check) Run(ctx context.Context, body []byte) *openai.Error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(body))
	if err != nil {
		return c.failed(err)
	}
	req.Header.Set("content-type", "application/json")
	resp, err := c.Client.Do(req)
	if err != nil {
		return c.failed(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		var r struct{ Reason, Message string }
		_ = json.Unmarshal(b, &r)
		msg := r.Reason
		if msg == "" {
			msg = r.Message
		}
		if msg == "" {
			msg = "the request was rejected by the " + c.Name + " check"
		}
		return openai.NewError(http.StatusBadRequest, openai.TypeInvalidRequest, "content_policy_violation", "", msg)
	}
	return c.failed(&statusError{resp.StatusCode})
}

func (c *Check) failed(err error) *openai.Error {
	c.Log.Warn("external check failed", "check", c.Name, "err", err, "admit", c.Allow)
	if c.Allow {
		return nil
	}
	return openai.NewError(http.StatusServiceUnavailable, openai.TypeServer, "check_unavailable", "",
		"the gateway's "+c.Name+" check is unavailable; retry shortly")
}

type statusError struct{ code int }

func (e *statusError) Error() string { return "status " + http.StatusText(e.code) }
