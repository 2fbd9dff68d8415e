package compose

import (
	"bytes"
	"crypto/subtle"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"

	"github.com/infergate/infergate/internal/config"
)

// DebugPages mounts under /debug/ what admin turns on: the pages pages
// registers with admin.debug.enabled, Go's profiler with admin.pprof; both
// behind admin.debug.tokenFile when it is set. Nothing is mounted (404)
// when neither is on.
func DebugPages(mux *http.ServeMux, admin config.Admin, pages func(*http.ServeMux)) {
	if !admin.ServesDebug() {
		return
	}
	debug := http.NewServeMux()
	if admin.Debug.Enabled {
		pages(debug)
	}
	if admin.Pprof {
		debug.HandleFunc("GET /debug/pprof/", pprof.Index)
		debug.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		debug.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		debug.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		debug.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/debug/", Bearer(admin.Debug.TokenFile, debug))
}

// maxTokenBytes bounds the token file read on every /debug request.
const maxTokenBytes = 4096

// ReadToken reads the bearer token from file: trimmed, non-empty.
func ReadToken(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+1))
	switch token := bytes.TrimSpace(b); {
	case err != nil:
		return nil, err
	case len(b) > maxTokenBytes:
		return nil, fmt.Errorf("%s: longer than %d bytes", file, maxTokenBytes)
	case len(token) == 0:
		return nil, fmt.Errorf("%s: empty", file)
	default:
		return token, nil
	}
}

// CheckDebugToken fails at start when admin.debug.tokenFile is set but
// holds no token.
func CheckDebugToken(admin config.Admin) error {
	if admin.Debug.TokenFile == "" || !admin.ServesDebug() {
		return nil
	}
	if _, err := ReadToken(admin.Debug.TokenFile); err != nil {
		return fmt.Errorf("admin.debug.tokenFile: %w", err)
	}
	return nil
}

// Bearer serves h to requests with "Authorization: Bearer TOKEN", TOKEN the
// file's content, read on every request (a rotated Secret applies at once);
// others get 401, as does every request while the file holds no token.
// Without a file, h is served as is.
func Bearer(tokenFile string, h http.Handler) http.Handler {
	if tokenFile == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		want, err := ReadToken(tokenFile)
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if err != nil || !ok || subtle.ConstantTimeCompare([]byte(got), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="infergate debug"`)
			http.Error(w, "unauthorized: /debug/ needs the bearer token of admin.debug.tokenFile", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// adminIndex answers GET / on the admin port: what the port serves, with
// links, so that a first look at it is not a 404. It lists the /debug
// pages only when they are on (their content stays behind the token).
func adminIndex(admin config.Admin, controller, keys, requests bool) http.Handler {
	type page struct{ path, what string }
	pages := []page{
		{"/metrics", "Prometheus metrics (OpenTelemetry GenAI names and infergate's own)"},
		{"/healthz", "alive; says which reload was refused, if any (the last good version serves)"},
		{"/readyz", "ready to decide"},
	}
	if admin.Debug.Enabled {
		pages = append(pages, page{"/debug/spend", "spend by tenant, team, key and model"})
		if controller {
			pages = append(pages, page{"/debug/controller", "the SLA controller: pools, observations, weights and why"})
		}
		if requests {
			pages = append(pages, page{"/debug/requests", "the latest requests' stamps"})
		}
		if keys {
			pages = append(pages, page{"/debug/keys", "the API keys' last use"})
		}
	}
	if admin.Pprof {
		pages = append(pages, page{"/debug/pprof/", "Go's profiler"})
	}
	var b strings.Builder
	b.WriteString("<!doctype html>\n<meta charset=utf-8>\n<title>infergate admin</title>\n<h1>infergate admin</h1>\n<ul>\n")
	for _, p := range pages {
		fmt.Fprintf(&b, "<li><a href=\"%s\">%s</a>: %s</li>\n", p.path, p.path, html.EscapeString(p.what))
	}
	b.WriteString("</ul>\n")
	if admin.ServesDebug() && admin.Debug.TokenFile != "" {
		b.WriteString("<p>The /debug pages need <code>Authorization: Bearer</code> with admin.debug.tokenFile's token.</p>\n")
	}
	body := b.String()
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, body)
	})
}
