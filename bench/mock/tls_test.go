package mock

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/infergate/infergate/internal/testutil/pipenet"
	"github.com/infergate/infergate/internal/testutil/testpki"
)

// Served over TLS (as `infergate mock --tls-cert` does), the mock records
// the Host, SNI and ALPN protocol of each request, and streams event by
// event over HTTP/2 and HTTP/1.1 alike.
func TestLastRequestInfoTLS(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const name = "pool.hosted.test"
		ca := testpki.NewCA(t, "mock test CA")
		s := New(Config{TTFT: 5 * time.Millisecond, ITL: 10 * time.Millisecond}, nil)
		var n pipenet.Net
		ts := &httptest.Server{Listener: n.Listen(), Config: &http.Server{Handler: s.Handler()}, EnableHTTP2: true}
		// Both protocols by ALPN, as http.Server.ServeTLS offers them.
		ts.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Server(t, name).TLS(t)}, NextProtos: []string{"h2", "http/1.1"}}
		ts.StartTLS()
		t.Cleanup(ts.Close)
		if info := s.LastRequestInfo(); info != (RequestInfo{}) {
			t.Fatalf("LastRequestInfo before any request = %+v, want the zero value", info)
		}

		body := `{"model":"mock-model","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
		for _, proto := range []string{"h2", "http/1.1"} {
			var p http.Protocols
			p.SetHTTP2(proto == "h2")
			p.SetHTTP1(proto == "http/1.1")
			// The client of ts.Client(), which streamRequest uses, dials the
			// address but names the host in its SNI and checks it against the
			// CA; it offers the protocol by ALPN, as Envoy does.
			ts.Client().Transport = &http.Transport{Protocols: &p,
				TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: name, NextProtos: []string{proto}}, DialContext: n.Dial}
			events, _ := streamRequest(t, ts, "/v1/chat/completions", body, nil)
			got := parseStream(t, events, true)
			if n := len(got.contentT); n != 10 {
				t.Fatalf("%s: %d content events, want 10", proto, n)
			}
			// Incremental: in virtual time, 9 gaps of exactly 10ms
			// between the first and the last.
			if spread := got.contentT[9] - got.contentT[0]; spread != 90*time.Millisecond {
				t.Errorf("%s: content events arrived over %v, want 90ms", proto, spread)
			}
			info := s.LastRequestInfo()
			if info.TLS == nil || info.TLS.ServerName != name || info.TLS.NegotiatedProtocol != proto {
				t.Fatalf("%s: TLS state %+v, want ServerName %q, NegotiatedProtocol %q", proto, info.TLS, name, proto)
			}
			if wantProto := map[string]string{"h2": "HTTP/2.0", "http/1.1": "HTTP/1.1"}[proto]; info.Proto != wantProto || info.Host != ts.Listener.Addr().String() {
				t.Errorf("%s: arrived as %s for %q, want %s for %q", proto, info.Proto, info.Host, wantProto, ts.Listener.Addr())
			}
		}

		// Plain text leaves no TLS state.
		plain, pts := newVirtualServer(t, noDelay())
		do(t, pts, http.MethodPost, "/v1/chat/completions", chatBody, nil)
		if info := plain.LastRequestInfo(); info.TLS != nil || info.Proto != "HTTP/1.1" {
			t.Errorf("plain HTTP: LastRequestInfo = %+v, want HTTP/1.1 without TLS state", info)
		}
	})
}
