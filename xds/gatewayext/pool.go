package gatewayext

import (
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The InferencePool kind Envoy Gateway hands over (extensionManager.
// backendResources).
const (
	PoolGroup      = "inference.networking.k8s.io"
	PoolKind       = "InferencePool"
	poolAPIVersion = PoolGroup + "/v1"
)

// maxPoolBytes bounds one InferencePool object as Envoy Gateway sends it;
// the API server's own limit on an object is larger, a pool is a few KiB.
const maxPoolBytes = 256 << 10

// Pool is what the extension needs of an InferencePool: who it is, and
// where its Endpoint Picker listens.
type Pool struct {
	Namespace, Name string
	// Picker is the picker's Service (spec.endpointPickerRef.name), in the
	// pool's namespace, and PickerPort its port.
	Picker     string
	PickerPort uint32
	// FailOpen lets a request through without a pick when the picker
	// fails (failureMode: FailOpen); the default fails closed.
	FailOpen bool

	// Weight and Headers are those of the backendRef a cluster is the
	// pool's for, which Envoy Gateway leaves out (restoreBackends).
	Weight  uint32
	Headers Headers
}

func (p Pool) key() string { return p.Namespace + "/" + p.Name }

// PickerFilterName is the pool's picker's ext_proc filter in Envoy's
// chain, and PickerClusterName the picker's gRPC cluster.
func PickerFilterName(p Pool) string  { return "infergate.endpoint-picker/" + p.key() }
func PickerClusterName(p Pool) string { return "infergate.endpoint-picker/" + p.key() }

// inferencePool is the part of an inference.networking.k8s.io/v1
// InferencePool the extension reads.
type inferencePool struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		EndpointPickerRef struct {
			Group *string `json:"group"`
			Kind  string  `json:"kind"`
			Name  string  `json:"name"`
			Port  *struct {
				Number int64 `json:"number"`
			} `json:"port"`
			FailureMode string `json:"failureMode"`
		} `json:"endpointPickerRef"`
	} `json:"spec"`
}

// ParsePool reads an extension resource Envoy Gateway sent: ok is false
// for anything but an InferencePool, and an InferencePool whose picker
// infergate cannot reach is an error.
func ParsePool(raw []byte) (p Pool, ok bool, err error) {
	if len(raw) > maxPoolBytes {
		return Pool{}, false, fmt.Errorf("extension resource of %d bytes, more than %d", len(raw), maxPoolBytes)
	}
	var ip inferencePool
	if err := json.Unmarshal(raw, &ip); err != nil {
		return Pool{}, false, fmt.Errorf("extension resource: %w", err)
	}
	if ip.Kind != PoolKind || ip.APIVersion != poolAPIVersion {
		return Pool{}, false, nil
	}
	at := "InferencePool " + ip.Metadata.Namespace + "/" + ip.Metadata.Name
	if len(validation.IsDNS1123Label(ip.Metadata.Namespace)) > 0 || len(validation.IsDNS1123Subdomain(ip.Metadata.Name)) > 0 {
		return Pool{}, true, fmt.Errorf("%q: not a Kubernetes namespace and name", at)
	}
	ref := ip.Spec.EndpointPickerRef
	if (ref.Group != nil && *ref.Group != "") || (ref.Kind != "" && ref.Kind != "Service") {
		return Pool{}, true, fmt.Errorf("%s: endpointPickerRef must be a Service", at)
	}
	if len(validation.IsDNS1035Label(ref.Name)) > 0 {
		return Pool{}, true, fmt.Errorf("%s: endpointPickerRef.name %q is not a Service name", at, ref.Name)
	}
	if ref.Port == nil || ref.Port.Number < 1 || ref.Port.Number > 65535 {
		return Pool{}, true, errors.New(at + ": endpointPickerRef.port.number must be 1 to 65535")
	}
	p = Pool{Namespace: ip.Metadata.Namespace, Name: ip.Metadata.Name, Picker: ref.Name, PickerPort: uint32(ref.Port.Number)}
	switch ref.FailureMode {
	case "", "FailClose":
	case "FailOpen":
		p.FailOpen = true
	default:
		return Pool{}, true, fmt.Errorf("%s: endpointPickerRef.failureMode %q is neither FailOpen nor FailClose", at, ref.FailureMode)
	}
	return p, true, nil
}
