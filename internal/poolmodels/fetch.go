package poolmodels

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// maxKeyBytes bounds an API key file.
const maxKeyBytes = 4 << 10

// Fetcher reads a pool's model list over HTTP(S) (the system's roots), in
// timeout at most, following no redirect: the list is read from the
// address configured, never from one the pool names.
func Fetcher(timeout time.Duration) func(context.Context, Pool) ([]string, error) {
	client := &http.Client{
		Timeout: timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return func(ctx context.Context, p Pool) ([]string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("accept", "application/json")
		if p.APIKeyFile != "" {
			key, err := readKey(p.APIKeyFile)
			if err != nil {
				return nil, err
			}
			req.Header.Set("authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // reuse the connection
			return nil, fmt.Errorf("GET %s: status %d", p.URL, resp.StatusCode)
		}
		ids, err := Parse(resp.Body)
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", p.URL, err)
		}
		return ids, nil
	}
}

// readKey reads a bearer token from a file (a mounted Secret's, trailing
// newline and all).
func readKey(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyBytes+1))
	if err != nil {
		return "", err
	}
	key := strings.TrimSpace(string(b))
	if len(b) > maxKeyBytes || key == "" || strings.ContainsFunc(key, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return "", fmt.Errorf("%s: not one token of at most %d printable ASCII bytes", path, maxKeyBytes)
	}
	return key, nil
}

// Parse reads the ids of an OpenAI model list ({"object": "list", "data":
// [{"id": ...}, ...]}) of at most MaxBodyBytes. The ids are not yet bounded
// (see Bound).
func Parse(r io.Reader) ([]string, error) {
	body, err := io.ReadAll(io.LimitReader(r, MaxBodyBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > MaxBodyBytes {
		return nil, fmt.Errorf("%w: longer than %d bytes", errNotList, MaxBodyBytes)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&list); err != nil {
		return nil, fmt.Errorf("%w: %v", errNotList, err)
	}
	if list.Data == nil {
		return nil, fmt.Errorf("%w: no data", errNotList)
	}
	ids := make([]string, len(list.Data))
	for i, m := range list.Data {
		ids[i] = m.ID
	}
	return ids, nil
}

// ValidID reports whether id can be listed: 1 to MaxIDBytes bytes of
// printable UTF-8 without white space (it is echoed to clients, set as a
// routing header and written to logs).
func ValidID(id string) bool {
	return id != "" && len(id) <= MaxIDBytes && utf8.ValidString(id) &&
		!strings.ContainsFunc(id, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) })
}
