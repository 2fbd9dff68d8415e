package weightsink

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/request"
	"gopkg.in/yaml.v3"
)

// The same weights, in a cluster: the HTTPRoute (Envoy Gateway) or the
// Istio VirtualService is read and replaced through the Kubernetes API, as
// the pod's service account (the Helm chart grants get and update on that
// one resource). Replacing sends the resourceVersion read, so a concurrent
// edit makes the API refuse (409) and the sink reads again.

// Kube is a minimal Kubernetes API client: get and replace one object.
type Kube struct {
	// Base is the API server URL, e.g. https://10.0.0.1:443.
	Base string
	// TokenFile is re-read on every call: projected tokens rotate.
	TokenFile string
	HTTP      *http.Client
}

// In-cluster credentials, where Kubernetes mounts them.
const (
	saDir = "/var/run/secrets/kubernetes.io/serviceaccount"
)

// InCluster returns a client for the API server the pod runs under.
func InCluster() (*Kube, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, errors.New("kubernetes: not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset)")
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w (is automountServiceAccountToken on?)", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("kubernetes: no certificate in " + saDir + "/ca.crt")
	}
	return &Kube{
		Base:      "https://" + net.JoinHostPort(host, port),
		TokenFile: saDir + "/token",
		HTTP: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		}},
	}, nil
}

// errConflict is the API's 409: the object changed since it was read.
var errConflict = errors.New("kubernetes: conflict")

func (k *Kube) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(k.Base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("accept", "application/json")
	if body != nil {
		req.Header.Set("content-type", "application/json")
	}
	if k.TokenFile != "" {
		tok, err := os.ReadFile(k.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: %w", err)
		}
		req.Header.Set("authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := k.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	switch {
	case resp.StatusCode == http.StatusConflict:
		return nil, errConflict
	case resp.StatusCode/100 != 2:
		var st struct{ Message string }
		_ = json.Unmarshal(b, &st)
		return nil, fmt.Errorf("kubernetes: %s %s: %d %s", method, path, resp.StatusCode, st.Message)
	}
	return b, nil
}

// update reads the object at path, lets edit change it (reporting whether
// it did) and replaces it, reading again on a conflict.
func (k *Kube) update(ctx context.Context, path string, edit func(obj *yaml.Node) (bool, error)) error {
	for attempt := 0; ; attempt++ {
		b, err := k.do(ctx, http.MethodGet, path, nil)
		if err != nil {
			return err
		}
		var doc yaml.Node // JSON is YAML: one node API for files and the API
		if err := yaml.Unmarshal(b, &doc); err != nil || len(doc.Content) == 0 {
			return fmt.Errorf("kubernetes: %s: not an object", path)
		}
		changed, err := edit(doc.Content[0])
		if err != nil || !changed {
			return err
		}
		var obj any
		if err := doc.Content[0].Decode(&obj); err != nil {
			return err
		}
		body, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		if _, err = k.do(ctx, http.MethodPut, path, body); !errors.Is(err, errConflict) || attempt == 2 {
			return err
		}
	}
}

// read fetches the object at path.
func (k *Kube) read(ctx context.Context, path string) (*yaml.Node, error) {
	b, err := k.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil || len(doc.Content) == 0 {
		return nil, fmt.Errorf("kubernetes: %s: not an object", path)
	}
	return doc.Content[0], nil
}

// HTTPRoute is a Gateway API HTTPRoute in a cluster (Envoy Gateway).
type HTTPRoute struct {
	Kube            *Kube
	Namespace, Name string

	mu       sync.Mutex
	backends map[string]string
}

func (a *HTTPRoute) path() string {
	return "/apis/gateway.networking.k8s.io/v1/namespaces/" + a.Namespace + "/httproutes/" + a.Name
}

// Load reads the route and learns its backends.
func (a *HTTPRoute) Load(ctx context.Context) error {
	route, err := a.Kube.read(ctx, a.path())
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.backends = localities(route, a.Namespace, a.Name)
	a.mu.Unlock()
	return nil
}

// Resolve maps an Envoy Gateway locality to its backendRef.
func (a *HTTPRoute) Resolve(pool string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if name, ok := a.backends[pool]; ok {
		return name
	}
	return pool
}

// Apply sets each virtual model's rule's backendRef weights.
func (a *HTTPRoute) Apply(ctx context.Context, weights map[string]map[string]uint32) error {
	return a.Kube.update(ctx, a.path(), func(route *yaml.Node) (bool, error) {
		a.mu.Lock()
		a.backends = localities(route, a.Namespace, a.Name)
		a.mu.Unlock()
		return setWeights(route, a.Name, weights)
	})
}

// VirtualService is an Istio VirtualService in a cluster: each virtual
// model is the http route whose match has headers x-infergate-model
// {exact: model}; its pools are that route's destinations, by host (or by
// subset, when destinations share a host).
type VirtualService struct {
	Kube            *Kube
	Namespace, Name string
}

func (v *VirtualService) path() string {
	return "/apis/networking.istio.io/v1/namespaces/" + v.Namespace + "/virtualservices/" + v.Name
}

// Load checks the VirtualService can be read.
func (v *VirtualService) Load(ctx context.Context) error {
	_, err := v.Kube.read(ctx, v.path())
	return err
}

// Resolve returns pool unchanged: Istio's cluster names carry the host.
func (v *VirtualService) Resolve(pool string) string { return pool }

// Apply sets each virtual model's destination weights.
func (v *VirtualService) Apply(ctx context.Context, weights map[string]map[string]uint32) error {
	return v.Kube.update(ctx, v.path(), func(vs *yaml.Node) (bool, error) {
		changed := false
		for vm, ws := range weights {
			route := virtualServiceRoute(vs, vm)
			if route == nil {
				return false, fmt.Errorf("virtualservice %s: no http route matches %s: %s", v.Name, request.ModelHeader, vm)
			}
			seen := 0
			for _, dst := range seq(mapGet(route, "route")) {
				d := mapGet(dst, "destination")
				w, ok := ws[scalar(mapGet(d, "subset"))]
				if !ok {
					w, ok = ws[scalar(mapGet(d, "host"))]
				}
				if !ok {
					continue
				}
				seen++
				changed = setScalar(dst, "weight", strconv.FormatUint(uint64(w), 10)) || changed
			}
			if seen != len(ws) {
				return false, fmt.Errorf("virtualservice %s: the route for %s has %d of the %d pools as destinations", v.Name, vm, seen, len(ws))
			}
		}
		return changed, nil
	})
}

// virtualServiceRoute finds the http route matching x-infergate-model: vm.
func virtualServiceRoute(vs *yaml.Node, vm string) *yaml.Node {
	for _, h := range seq(mapGet(mapGet(vs, "spec"), "http")) {
		for _, m := range seq(mapGet(h, "match")) {
			if scalar(mapGet(mapGet(mapGet(m, "headers"), request.ModelHeader), "exact")) == vm {
				return h
			}
		}
	}
	return nil
}
