package weightsink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/infergate/infergate/internal/request"
	"gopkg.in/yaml.v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

// The same weights, in a cluster: the HTTPRoute (Envoy Gateway) or the
// Istio VirtualService is read and replaced through the Kubernetes API, as
// the pod's service account (the Helm chart grants get and update on that
// one resource). Replacing sends the resourceVersion read, so a concurrent
// edit makes the API refuse (409) and the sink reads again.

// Kube is the Kubernetes API, as the sinks use it: get and replace one
// object of a custom resource.
type Kube struct {
	Client dynamic.Interface
}

// The resources the sinks edit.
var (
	httpRoutes      = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
	virtualServices = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}
)

const (
	// kubeTimeout bounds one API call; the caller's context may be shorter.
	kubeTimeout   = 10 * time.Second
	kubeUserAgent = "infergate-controller"
)

// Connect returns a client for the cluster: the kubeconfig KUBECONFIG names
// when it is set (a controller run outside the cluster), else the pod's
// service account.
func Connect() (*Kube, error) {
	cfg, err := restConfig()
	if err != nil {
		return nil, err
	}
	return NewKube(cfg)
}

func restConfig() (*rest.Config, error) {
	if path := os.Getenv("KUBECONFIG"); path != "" {
		// Like kubectl: a list of files, merged, using the current context.
		rules := &clientcmd.ClientConfigLoadingRules{Precedence: filepath.SplitList(path)}
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if clientcmd.IsEmptyConfig(err) {
			// Missing files are skipped, and client-go's own hint
			// (KUBERNETES_MASTER) points the wrong way.
			return nil, fmt.Errorf("kubernetes: KUBECONFIG=%s: no cluster to use (missing file, or no current-context)", path)
		}
		if err != nil {
			return nil, fmt.Errorf("kubernetes: KUBECONFIG=%s: %w", path, err)
		}
		return cfg, nil
	}
	// In a pod, client-go re-reads the projected token as it rotates.
	cfg, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		return nil, errors.New("kubernetes: not running in a cluster (KUBERNETES_SERVICE_HOST/PORT unset) and KUBECONFIG unset")
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w (is automountServiceAccountToken on?)", err)
	}
	return cfg, nil
}

// NewKube returns a client for the API server cfg names, with cfg's
// credentials. A timeout and user agent are set where cfg has none.
func NewKube(cfg *rest.Config) (*Kube, error) {
	if cfg == nil {
		return nil, errors.New("kubernetes: no client configuration")
	}
	cfg = rest.CopyConfig(cfg)
	if cfg.Timeout == 0 {
		cfg.Timeout = kubeTimeout
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = kubeUserAgent
	}
	// client-go's default client-side limit (5 requests/s, bursts of 10)
	// delays the write after its read once a few conflicts have drained the
	// bucket, and a delayed write meets the next conflict: against busy
	// writers on the real API server, applies failed. A sink makes two
	// requests per attempt, with backoff between attempts.
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		cfg.QPS, cfg.Burst = 50, 100
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	return &Kube{Client: client}, nil
}

// conflictBackoff is how long a write keeps reading again after 409s.
// client-go's DefaultRetry (5 tries within ~50 ms) gave up on the real API
// server against two writers 5-15 ms apart (a gateway controller writing
// the route's status moves its resourceVersion too): up to ~10 s here,
// jittered so racing writers spread out; the caller's context bounds it.
var conflictBackoff = wait.Backoff{Steps: 30, Duration: 5 * time.Millisecond, Factor: 1.5, Jitter: 1, Cap: 500 * time.Millisecond}

// object names one object in errors, e.g. "httproute ai/llm".
type object struct {
	kind            string
	res             schema.GroupVersionResource
	namespace, name string
}

func (o object) String() string { return o.kind + " " + o.namespace + "/" + o.name }

// update reads the object, lets edit change it (reporting whether it did)
// and replaces it, reading again on a conflict. An unchanged object is not
// written: every write makes the gateway re-translate.
func (k *Kube) update(ctx context.Context, o object, edit func(obj *yaml.Node) (bool, error)) error {
	api := k.Client.Resource(o.res).Namespace(o.namespace)
	var editErr error
	err := retry.RetryOnConflict(conflictBackoff, func() error {
		obj, err := api.Get(ctx, o.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node, err := toNode(obj)
		if err != nil {
			return err
		}
		var changed bool
		// An edit's error already names the object and is not retried.
		if changed, editErr = edit(node); editErr != nil || !changed {
			return nil
		}
		if err := fromNode(node, obj); err != nil {
			return err
		}
		_, err = api.Update(ctx, obj, metav1.UpdateOptions{FieldManager: kubeUserAgent})
		return err
	})
	if err != nil {
		// The API's status error stays inspectable (apierrors.IsForbidden)
		// and its message, e.g. which verb RBAC refused, stays in the text.
		return fmt.Errorf("kubernetes: %s: %w", o, err)
	}
	return editErr
}

// read fetches the object.
func (k *Kube) read(ctx context.Context, o object) (*yaml.Node, error) {
	obj, err := k.Client.Resource(o.res).Namespace(o.namespace).Get(ctx, o.name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %s: %w", o, err)
	}
	node, err := toNode(obj)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %s: %w", o, err)
	}
	return node, nil
}

// toNode turns an object into a YAML node (JSON is YAML), so files and the
// API share one set of edits.
func toNode(obj *unstructured.Unstructured) (*yaml.Node, error) {
	b, err := obj.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil || len(doc.Content) == 0 {
		return nil, errors.New("not an object")
	}
	return doc.Content[0], nil
}

// fromNode replaces obj's content with node's. It goes through JSON so the
// numbers become the int64 and float64 unstructured objects hold.
func fromNode(node *yaml.Node, obj *unstructured.Unstructured) error {
	var v any
	if err := node.Decode(&v); err != nil {
		return err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return obj.UnmarshalJSON(b)
}

// HTTPRoute is a Gateway API HTTPRoute in a cluster (Envoy Gateway).
type HTTPRoute struct {
	Kube            *Kube
	Namespace, Name string

	mu       sync.Mutex
	backends map[string]string
}

func (a *HTTPRoute) object() object {
	return object{kind: "httproute", res: httpRoutes, namespace: a.Namespace, name: a.Name}
}

// Load reads the route and learns its backends.
func (a *HTTPRoute) Load(ctx context.Context) error {
	route, err := a.Kube.read(ctx, a.object())
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.backends = localities(route, a.Namespace, a.Name)
	a.mu.Unlock()
	return nil
}

// Resolve maps an Envoy Gateway locality, or a backendRef's namespace/name,
// to the pool it is.
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
	return a.Kube.update(ctx, a.object(), func(route *yaml.Node) (bool, error) {
		changed, aliases, err := setWeights(route, a.Name, weights)
		if err != nil {
			return false, err
		}
		a.mu.Lock()
		a.backends = localities(route, a.Namespace, a.Name)
		maps.Copy(a.backends, aliases)
		a.mu.Unlock()
		return changed, nil
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

func (v *VirtualService) object() object {
	return object{kind: "virtualservice", res: virtualServices, namespace: v.Namespace, name: v.Name}
}

// Load checks the VirtualService can be read.
func (v *VirtualService) Load(ctx context.Context) error {
	_, err := v.Kube.read(ctx, v.object())
	return err
}

// Resolve names the pool of an Istio cluster (outbound|port|subset|host,
// what Envoy reports): its subset when it has one, else its host, as a
// destination is named in the configuration. Other names are returned
// unchanged.
func (v *VirtualService) Resolve(pool string) string {
	f := strings.Split(pool, "|")
	if len(f) != 4 || f[0] != "outbound" || f[3] == "" {
		return pool
	}
	if f[2] != "" {
		return f[2]
	}
	return f[3]
}

// Apply sets each virtual model's destination weights.
func (v *VirtualService) Apply(ctx context.Context, weights map[string]map[string]uint32) error {
	return v.Kube.update(ctx, v.object(), func(vs *yaml.Node) (bool, error) {
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
