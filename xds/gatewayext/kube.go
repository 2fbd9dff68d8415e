package gatewayext

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// KubeRoutes reads HTTPRoutes through the Kubernetes API (the chart grants
// get on httproutes to the extension's service account).
type KubeRoutes struct {
	Client dynamic.Interface
}

var httpRoutes = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}

// routeTimeout bounds one read; Envoy Gateway's own call has its deadline.
const routeTimeout = 10 * time.Second

// httpRoute is the part of an HTTPRoute the extension reads.
type httpRoute struct {
	Spec struct {
		Rules []struct {
			BackendRefs []struct {
				Group     *string `json:"group"`
				Kind      *string `json:"kind"`
				Namespace *string `json:"namespace"`
				Name      string  `json:"name"`
				Weight    *int64  `json:"weight"`
				Filters   []struct {
					Type                   string      `json:"type"`
					RequestHeaderModifier  *HeaderEdit `json:"requestHeaderModifier"`
					ResponseHeaderModifier *HeaderEdit `json:"responseHeaderModifier"`
				} `json:"filters"`
			} `json:"backendRefs"`
		} `json:"rules"`
	} `json:"spec"`
}

// BackendRefs implements Routes.
func (k KubeRoutes) BackendRefs(ctx context.Context, namespace, name string) ([][]BackendRef, error) {
	ctx, cancel := context.WithTimeout(ctx, routeTimeout)
	defer cancel()
	obj, err := k.Client.Resource(httpRoutes).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading HTTPRoute %s/%s: %w", namespace, name, err)
	}
	var route httpRoute
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.UnstructuredContent(), &route); err != nil {
		return nil, fmt.Errorf("HTTPRoute %s/%s: %w", namespace, name, err)
	}
	return rulesOf(route, namespace), nil
}

// rulesOf spells out the API's defaults: a backendRef is a core Service
// in the route's namespace, of weight 1, unless it says otherwise.
func rulesOf(route httpRoute, namespace string) [][]BackendRef {
	deref := func(s *string, def string) string {
		if s == nil {
			return def
		}
		return *s
	}
	rules := make([][]BackendRef, len(route.Spec.Rules))
	for i, r := range route.Spec.Rules {
		for _, b := range r.BackendRefs {
			w := int64(1)
			if b.Weight != nil {
				w = *b.Weight
			}
			ref := BackendRef{Group: deref(b.Group, ""), Kind: deref(b.Kind, "Service"),
				Namespace: deref(b.Namespace, namespace), Name: b.Name, Weight: w}
			for _, f := range b.Filters {
				switch {
				case f.Type == "RequestHeaderModifier" && f.RequestHeaderModifier != nil:
					ref.Headers.Request = mergeEdits(ref.Headers.Request, *f.RequestHeaderModifier)
				case f.Type == "ResponseHeaderModifier" && f.ResponseHeaderModifier != nil:
					ref.Headers.Response = mergeEdits(ref.Headers.Response, *f.ResponseHeaderModifier)
				default:
					ref.Unsupported = append(ref.Unsupported, f.Type)
				}
			}
			rules[i] = append(rules[i], ref)
		}
	}
	return rules
}

func mergeEdits(a, b HeaderEdit) HeaderEdit {
	return HeaderEdit{Set: append(a.Set, b.Set...), Add: append(a.Add, b.Add...), Remove: append(a.Remove, b.Remove...)}
}
