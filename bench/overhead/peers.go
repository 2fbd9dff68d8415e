package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Peer lanes: other LLM gateways measured in the main phases beside
// infergate, on the same mock with the same load, their processes pinned
// to the gateway CPUs like Envoy and infergate. A peer's failed requests
// and bodies are recorded in its row and never fail the run; a peer that
// cannot be installed or started, or stops, is reported with its error.
// scripts/install-peers.sh installs them, pinned, into .tools/.

const (
	peerLiteLLM = "litellm"
	peerPortkey = "portkey"
)

var allPeers = []string{peerLiteLLM, peerPortkey}

// mockHeaders are the load's x-mock-* headers, which set the mock's
// cadence per request: a peer must pass them on.
var mockHeaders = []string{"x-mock-ttft-ms", "x-mock-itl-ms", "x-mock-tokens", "x-mock-emit-timestamps"}

// PeerInfo is one peer lane: what ran, what it does per request, and why
// it did not run (or stopped running), if so.
type PeerInfo struct {
	Key        string `json:"key"`
	Name       string `json:"name"`
	Version    string `json:"version,omitempty"`
	PerRequest string `json:"per_request"` // what it does for each request
	Setup      string `json:"setup"`       // how it ran
	Compared   string `json:"compared"`    // what of its bodies is compared with direct's
	Error      string `json:"error,omitempty"`
	// Ratios are infergate's numbers over this peer's, in the same run.
	Ratios []Ratio `json:"ratios,omitempty"`
}

// Ratio is infergate's number over a peer's; Missing says why there is
// none (a phase not run, or nothing measured in it).
type Ratio struct {
	Name      string  `json:"name"`
	Infergate float64 `json:"infergate"`
	Peer      float64 `json:"peer"`
	Unit      string  `json:"unit"`
	Ratio     float64 `json:"ratio"`
	Missing   string  `json:"missing,omitempty"`
}

// PeerCheck is how a peer lane's requests went in one phase.
type PeerCheck struct {
	Requests int `json:"requests"` // that ended, warm-up included
	Failed   int `json:"failed"`   // of them
	// Errors are the first few failures and mismatches.
	Errors []string `json:"errors,omitempty"`
	// Compared counts the bodies compared with direct's answer to the same
	// request by what a client reads (see contentDigest); ContentDiffered
	// those that differed, ByteIdentical those equal byte for byte too.
	Compared        int `json:"compared"`
	ContentDiffered int `json:"content_differed"`
	ByteIdentical   int `json:"byte_identical"`
	// Changed counts requests answered with other content than the same
	// request the time before on this peer.
	Changed int `json:"changed"`
}

// peer is a running peer lane.
type peer struct {
	info    *PeerInfo
	proc    *proc
	url     string
	headers map[string]string // sent with every request on its lane
}

func (p *peer) path() path {
	return path{name: p.info.Key, url: p.url, procs: []*proc{p.proc}, headers: p.headers, peer: true}
}

// startPeers installs and starts the peers opts asks for; those that
// cannot run are in the infos with their error, without a path.
func (h *harness) startPeers() ([]path, []*PeerInfo) {
	var paths []path
	var infos []*PeerInfo
	for _, key := range h.opts.Peers {
		info := peerInfo(key)
		infos = append(infos, info)
		p, err := h.startPeer(info)
		if err != nil {
			info.Error = err.Error()
			h.logf("peer %s: not measured: %v", key, err)
			continue
		}
		h.peers = append(h.peers, p)
		paths = append(paths, p.path())
	}
	return paths, infos
}

func peerInfo(key string) *PeerInfo {
	const gatewayCPUs = "its process on the gateway CPUs, like Envoy and infergate"
	switch key {
	case peerLiteLLM:
		return &PeerInfo{Key: key, Name: "LiteLLM proxy",
			PerRequest: "**auth:** its master key, on every request (virtual keys, with per-key limits and budgets, need its PostgreSQL database: not run); " +
				"**limits:** the model's rpm and tpm, checked before the call and charged after it, in memory, by its usage-based-routing-v2 " +
				"(set high, like infergate's bench tenant; with one deployment they are reported in x-ratelimit-* headers but did not deny " +
				"in a check here: rpm 3, tpm 30, five requests of 12 tokens, all answered); **token counting:** the prompt's tokens (tiktoken) " +
				"before the call, the response's usage after it, and a price per request; also: calls the mock through the OpenAI SDK, " +
				"rebuilds every response and stream chunk, forwards the client's x-* headers (the mock's cadence)",
			Setup: "bench/overhead/peers/litellm.yaml; `litellm --num_workers 1` (one uvicorn worker, one event loop), " + gatewayCPUs +
				"; no database, no callbacks, LITELLM_LOG=ERROR (no access log, as Envoy runs without one), the local model cost map",
			Compared: "content: message text, or every delta's text in order, and the finish reason (it rebuilds every chunk and drops the mock's SSE comments, so chunk transit is not measured)",
		}
	case peerPortkey:
		return &PeerInfo{Key: key, Name: "Portkey gateway",
			PerRequest: "**auth:** none (the bearer token goes on to the provider as its key); **limits:** none; **token counting:** none; " +
				"also: checks the routing headers (x-portkey-provider: openai; x-portkey-custom-host: the mock, against its SSRF rules), " +
				"parses the JSON body and maps it to the provider's request, calls the mock with fetch, forwards the x-mock-* headers " +
				"(x-portkey-forward-headers), splits the SSE stream into events and writes them on, the first one 25 ms late " +
				"(a fixed wait in its stream reader), and builds a log record per request for its log console",
			Setup: "`node build/start-server.js --headless` with NODE_ENV=production (one event loop), " + gatewayCPUs +
				"; @hono/node-server held at 1.14.1 (later releases fail its streams: Portkey-AI/gateway#1389); it listens on every interface (no host option)",
			Compared: "content (message text, or every delta's text in order, and the finish reason); byte-identical bodies are counted too",
		}
	}
	return &PeerInfo{Key: key, Name: key}
}

// startPeer installs a peer with scripts/install-peers.sh and starts it.
func (h *harness) startPeer(info *PeerInfo) (*peer, error) {
	h.logf("peer %s: installing (scripts/install-peers.sh)", info.Key)
	cmd := exec.Command(filepath.Join(h.opts.Root, "scripts", "install-peers.sh"), info.Key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("scripts/install-peers.sh %s: %w\n%s", info.Key, err, lastLines(stderr.String(), 20))
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	l, err := launchPeer(h.opts.Root, info.Key, installVars(out), port, fmt.Sprintf("http://127.0.0.1:%d/v1", h.mockPort))
	if err != nil {
		return nil, err
	}
	info.Version = l.version
	p := &peer{info: info, url: url, headers: l.headers}
	if p.proc, err = startProc(h.work, info.Key, h.opts.GatewayCPUs, l.env, l.bin, l.args...); err != nil {
		return nil, err
	}
	// LiteLLM imports for seconds before it listens, longer on a busy CPU.
	if err := p.proc.waitReadyFor(url+l.ready, 2*time.Minute); err != nil {
		p.proc.stop()
		return nil, err
	}
	if err := probe(p.url, p.headers); err != nil {
		p.proc.stop()
		return nil, fmt.Errorf("%w; log:\n%s", err, p.proc.tail())
	}
	h.logf("peer %s %s: ready at %s", info.Key, info.Version, p.url)
	return p, nil
}

// installVars reads scripts/install-peers.sh's output: NAME=value lines.
func installVars(out []byte) map[string]string {
	vars := map[string]string{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			vars[k] = v
		}
	}
	return vars
}

// peerInstallVars are the names each peer's launch reads from
// scripts/install-peers.sh's output.
var peerInstallVars = map[string][]string{
	peerLiteLLM: {"LITELLM_BIN", "LITELLM_VERSION"},
	peerPortkey: {"NODE_BIN", "PORTKEY_SERVER", "PORTKEY_VERSION"},
}

// peerLaunch is how a peer lane runs: its command and environment, the
// path that answers once it listens, and the headers its lane sends.
type peerLaunch struct {
	version string
	bin     string
	args    []string
	env     []string
	ready   string
	headers map[string]string
}

// launchPeer builds a peer's launch from what scripts/install-peers.sh
// printed (vars), the port it listens on and the mock's base URL (.../v1).
func launchPeer(root, key string, vars map[string]string, port int, mock string) (peerLaunch, error) {
	names, ok := peerInstallVars[key]
	if !ok {
		return peerLaunch{}, fmt.Errorf("unknown peer %q (want %s)", key, strings.Join(allPeers, ", "))
	}
	for _, name := range names {
		if vars[name] == "" {
			return peerLaunch{}, fmt.Errorf("peer %s: scripts/install-peers.sh printed no %s", key, name)
		}
	}
	switch key {
	case peerLiteLLM:
		return peerLaunch{version: vars["LITELLM_VERSION"], bin: vars["LITELLM_BIN"],
			args: []string{"--config", filepath.Join(root, "bench/overhead/peers/litellm.yaml"),
				"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--num_workers", "1"},
			env: []string{"MOCK_API_BASE=" + mock, "LITELLM_MASTER_KEY=" + benchKey,
				// Nothing fetched from outside at start (the model cost map is
				// in the package), and errors only in its log.
				"LITELLM_LOCAL_MODEL_COST_MAP=True", "LITELLM_LOG=ERROR"},
			ready: "/health/liveliness",
		}, nil
	default: // peerPortkey
		return peerLaunch{version: vars["PORTKEY_VERSION"], bin: vars["NODE_BIN"],
			args:  []string{vars["PORTKEY_SERVER"], "--port=" + strconv.Itoa(port), "--headless"},
			env:   []string{"NODE_ENV=production"},
			ready: "/",
			headers: map[string]string{"x-portkey-provider": "openai", "x-portkey-custom-host": mock,
				"x-portkey-forward-headers": strings.Join(mockHeaders, ",")},
		}, nil
	}
}

// livePeers drops the peer lanes whose process has exited, recording why.
func (h *harness) livePeers(paths []path, infos []*PeerInfo) []path {
	return slices.DeleteFunc(paths, func(pa path) bool {
		if !pa.peer || !pa.procs[0].exited() {
			return false
		}
		for _, info := range infos {
			if info.Key == pa.name && info.Error == "" {
				info.Error = fmt.Sprintf("%s exited during the run (%v); the phases after it are without it; log:\n%s",
					pa.name, pa.procs[0].State(), pa.procs[0].tail())
				h.logf("peer %s: exited", pa.name)
			}
		}
		return true
	})
}

// peerRatios are infergate's numbers over each peer's: added latency
// (paired medians at c=1), CPU per request (c=64, 20 ms mock) and per
// 1,000 streamed tokens (c=64 streams), and requests/s (c=64, 20 ms mock).
func peerRatios(r *Report) {
	c1, rps, st := r.phase("c1"), r.phase("rps-c64"), r.phase("stream-c64")
	for _, info := range r.Peers {
		info.Ratios = nil
		add := func(name, unit string, ig, peer float64) {
			if math.IsNaN(ig) || math.IsNaN(peer) || peer == 0 {
				info.Ratios = append(info.Ratios, Ratio{Name: name, Unit: unit, Missing: "not measured in this run"})
				return
			}
			info.Ratios = append(info.Ratios, Ratio{Name: name, Infergate: ig, Peer: peer, Unit: unit, Ratio: ig / peer})
		}
		key := info.Key
		peerAdds := pairedMedian(c1, direct, key)
		add("added latency at c=1 (paired median): infergate's share (Envoy + infergate − plain Envoy) over the peer's (peer − direct)", "ms",
			pairedMedian(c1, plain, gateway), peerAdds)
		add("added latency at c=1 (paired median): Envoy + infergate − direct over the peer's", "ms", pairedMedian(c1, direct, gateway), peerAdds)
		add("CPU per request at c=64, 20 ms mock: infergate over the peer", "ms", cpuPerRequest(rps, gateway+"-infergate"), cpuPerRequest(rps, key))
		add("CPU per request at c=64, 20 ms mock: Envoy + infergate over the peer", "ms",
			cpuPerRequest(rps, gateway+"-infergate")+cpuPerRequest(rps, gateway+"-envoy"), cpuPerRequest(rps, key))
		add("CPU per 1,000 streamed tokens at c=64: infergate over the peer", "s", cpuPer1k(st, gateway+"-infergate"), cpuPer1k(st, key))
		add("CPU per 1,000 streamed tokens at c=64: Envoy + infergate over the peer", "s",
			cpuPer1k(st, gateway+"-infergate")+cpuPer1k(st, gateway+"-envoy"), cpuPer1k(st, key))
		add("requests/s at c=64, 20 ms mock: Envoy + infergate over the peer (higher is better)", "req/s", reqPerS(rps, gateway), reqPerS(rps, key))
	}
}

// pairedMedian is the median of b − a over the requests both answered, in ms.
func pairedMedian(ph *PhaseResult, a, b string) float64 {
	if ph == nil {
		return math.NaN()
	}
	c := ph.compare(a, b)
	if c == nil || c.DeltaE2EMs.N == 0 {
		return math.NaN()
	}
	return c.DeltaE2EMs.P50
}

func cpuPerRequest(ph *PhaseResult, name string) float64 {
	if ph == nil {
		return math.NaN()
	}
	for _, u := range ph.CPU {
		if u.Name == name && u.Requests > 0 {
			return u.CPUSeconds / float64(u.Requests) * 1000
		}
	}
	return math.NaN()
}

func reqPerS(ph *PhaseResult, name string) float64 {
	if ph == nil || ph.path(name) == nil {
		return math.NaN()
	}
	return ph.path(name).Metrics.Throughput.RequestsPerS
}

// peersMarkdown renders the peer lanes: what each does and how it ran,
// their numbers beside direct and Envoy + infergate, the ratios, and every
// failure.
func peersMarkdown(r *Report) string {
	if len(r.Peers) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n**Peers** (other gateways on the same mock, load and pinning, measured in the same phases as lanes of their own; " +
		"a peer's failures are recorded here and do not fail the run):\n\n")
	b.WriteString("| peer | version | what it does per request | how it ran | bodies compared with direct's |\n|---|---|---|---|---|\n")
	b.WriteString("| Envoy + infergate | " + r.Version + " | **auth:** API key (the gate); **limits:** the example Rego policies and the tenant's token budgets, " +
		"in memory, reserved at the gate and settled by the meter; **token counting:** the prompt's estimate at the gate, the stream's usage at the meter; " +
		"also: TTFT, ITL and the gateway's own time stamped per request | envoy/overhead.yaml: Envoy `--concurrency 1` and infergate on the gateway CPUs | byte for byte |\n")
	for _, p := range r.Peers {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", p.Name, cellOr(p.Version), p.PerRequest, p.Setup, p.Compared)
	}
	for _, p := range r.Peers {
		if p.Error != "" {
			fmt.Fprintf(&b, "\n**%s was not measured, or stopped:** %s\n", p.Name, mdQuote(p.Error))
		}
	}

	var running []*PeerInfo
	for _, p := range r.Peers {
		for _, ph := range r.Phases {
			if ph.path(p.Key) != nil {
				running = append(running, p)
				break
			}
		}
	}
	if len(running) > 0 {
		b.WriteString("\n| lane | metric | direct | Envoy + infergate |")
		for _, p := range running {
			fmt.Fprintf(&b, " %s |", p.Name)
		}
		b.WriteString("\n|---|---|--:|--:|" + strings.Repeat("--:|", len(running)) + "\n")
		type row struct {
			label string
			pick  func(*PathResult) float64
		}
		lanes := []struct {
			key  string
			rows []row
		}{
			{"c1", []row{{"latency p50", e2eP(50)}, {"latency p99", e2eP(99)}}},
			{"stream-c1", []row{{"TTFT p50", ttftP(50)}, {"TTFT p99", ttftP(99)}, {"ITL p99", gapP(99)}}},
			{"stream-c64", []row{{"TTFT p50", ttftP(50)}, {"TTFT p99", ttftP(99)}, {"ITL p99", gapP(99)}}},
			{"stream-c256", []row{{"TTFT p50", ttftP(50)}, {"TTFT p99", ttftP(99)}, {"ITL p99", gapP(99)}}},
			{"rps-c64", []row{{"latency p50", e2eP(50)}, {"latency p99", e2eP(99)}, {"requests/s", reqs}}},
			{"rps-c256", []row{{"latency p50", e2eP(50)}, {"latency p99", e2eP(99)}, {"requests/s", reqs}}},
			{"stream-zero", []row{{"TTFT p50", ttftP(50)}, {"requests/s", reqs}}},
		}
		for _, lane := range lanes {
			ph := r.phase(lane.key)
			if ph == nil {
				continue
			}
			for i, rw := range lane.rows {
				title := ""
				if i == 0 {
					title = ph.Title
				}
				cell := func(name string) string {
					p := ph.path(name)
					if p == nil || p.Metrics.Requests.Succeeded == 0 {
						return "–"
					}
					v := rw.pick(p)
					if rw.label == "requests/s" {
						return fmt.Sprintf("%.1f", v)
					}
					return fmtMs(v)
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s |", title, rw.label, cell(direct), cell(gateway))
				for _, p := range running {
					b.WriteString(" " + cell(p.Key) + " |")
				}
				b.WriteString("\n")
			}
		}
	}

	b.WriteString("\n**infergate over each peer** (same run; below 1 infergate costs less, except requests/s where above 1 it serves more; " +
		"CPU is each process's over its windows, per request or token that ended in them: work on what is still in flight when a window closes " +
		"counts too, which weighs on a peer whose requests take long against short windows):\n\n")
	b.WriteString("| peer | ratio | infergate | peer | infergate ÷ peer |\n|---|---|--:|--:|--:|\n")
	for _, p := range r.Peers {
		if len(p.Ratios) == 0 {
			fmt.Fprintf(&b, "| %s | – (not measured) | | | |\n", p.Name)
		}
		for _, q := range p.Ratios {
			if q.Missing != "" {
				fmt.Fprintf(&b, "| %s | %s | – | – | – (%s) |\n", p.Name, q.Name, q.Missing)
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | **%.2f** |\n", p.Name, q.Name, fmtUnit(q.Infergate, q.Unit), fmtUnit(q.Peer, q.Unit), q.Ratio)
		}
	}

	b.WriteString("\n**Peers' failures and bodies** per phase (requests: all that ended, warm-up included):\n\n| lane | peer | requests | failed | bodies compared | content differed | byte-identical | first errors |\n|---|---|--:|--:|--:|--:|--:|---|\n")
	for _, ph := range r.Phases {
		for _, p := range ph.Paths {
			c := p.Peer
			if c == nil {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %d | %s |\n", ph.Title, pathLabel(p.Name), c.Requests, c.Failed,
				c.Compared, c.ContentDiffered, c.ByteIdentical, cellOr(mdQuote(strings.Join(c.Errors, "; "))))
		}
	}
	return b.String()
}

func reqs(p *PathResult) float64 { return p.Metrics.Throughput.RequestsPerS }

func fmtUnit(v float64, unit string) string {
	switch unit {
	case "ms":
		return fmtMs(v)
	case "s":
		return fmt.Sprintf("%.4f s", v)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

func cellOr(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// mdQuote makes text safe in a table cell: one line, no pipes, no
// terminal escapes (Portkey's log has a spinner).
func mdQuote(s string) string {
	s = strings.Join(strings.Fields(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && !unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s)), " ")
	if len(s) > 600 {
		s = s[:600] + "…"
	}
	return strings.ReplaceAll(s, "|", `\|`)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (h *harness) peerProcs() []*proc {
	var out []*proc
	for _, p := range h.peers {
		out = append(out, p.proc)
	}
	return out
}
