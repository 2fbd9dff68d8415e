package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/infergate/infergate/internal/identity"
)

// secretStore is a keys file in a Kubernetes Secret (the chart's
// apiKeys.existingSecret), which the gate reads as a mounted directory:
// kubelet updates the mount, the gate's reload picks it up. Writes are
// optimistic (the Secret's resourceVersion), so two commands at once both
// land, one after the other.
//
// The dynamic client: a Secret is three fields, not worth the typed
// clientset in the binary.
type secretStore struct {
	secrets         func(namespace string) dynamic.ResourceInterface
	namespace, name string
	key             string // the data key, e.g. keys.yaml
}

// newSecretStore connects to the cluster like kubectl: KUBECONFIG, else
// ~/.kube/config, else the pod's service account.
func newSecretStore(ref, key string) (*secretStore, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("--secret %q: want NAMESPACE/NAME", ref)
	}
	if !strings.HasSuffix(key, ".yaml") && !strings.HasSuffix(key, ".yml") {
		return nil, fmt.Errorf("--secret-key %q: the gate reads only *.yaml and *.yml files of a mounted Secret", key)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	cfg.Timeout, cfg.UserAgent = 30*time.Second, "infergate-keys"
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &secretStore{namespace: ns, name: name, key: key, secrets: func(ns string) dynamic.ResourceInterface {
		return dyn.Resource(secretsGVR).Namespace(ns)
	}}, nil
}

var secretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

func (s *secretStore) String() string {
	return fmt.Sprintf("secret %s/%s (%s)", s.namespace, s.name, s.key)
}

// get is the Secret (nil when there is none) and its keys file.
func (s *secretStore) get(ctx context.Context) (*unstructured.Unstructured, *identity.KeyFileEdit, error) {
	sec, err := s.secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		sec, err = nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s, err)
	}
	var b []byte
	if sec != nil {
		enc, _, err := unstructured.NestedString(sec.Object, "data", s.key)
		if err == nil {
			b, err = base64.StdEncoding.DecodeString(enc)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", s, err)
		}
	}
	f, err := identity.ParseKeyFile(s.String(), b)
	return sec, f, err
}

func (s *secretStore) read(ctx context.Context) (*identity.KeyFileEdit, error) {
	_, f, err := s.get(ctx)
	return f, err
}

func (s *secretStore) edit(ctx context.Context, fn func(*identity.KeyFileEdit) error) error {
	changed := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	return retry.OnError(retry.DefaultRetry, changed, func() error {
		sec, f, err := s.get(ctx)
		if err != nil {
			return err
		}
		if err := fn(f); err != nil {
			return noChange(err)
		}
		b, err := f.Bytes()
		if err != nil {
			return err
		}
		data := base64.StdEncoding.EncodeToString(b)
		if sec == nil {
			sec = &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
				"metadata": map[string]any{"name": s.name, "namespace": s.namespace,
					"labels": map[string]any{"app.kubernetes.io/managed-by": "infergate-keys"}},
				"data": map[string]any{s.key: data},
			}}
			_, err = s.secrets(s.namespace).Create(ctx, sec, metav1.CreateOptions{})
			return err
		}
		if err := unstructured.SetNestedField(sec.Object, data, "data", s.key); err != nil {
			return err
		}
		_, err = s.secrets(s.namespace).Update(ctx, sec, metav1.UpdateOptions{}) // a conflict when it changed since get
		return err
	})
}
