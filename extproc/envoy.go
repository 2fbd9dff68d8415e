package extproc

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/openai"
	"github.com/infergate/infergate/internal/request"
)

// attributesKey is where Envoy puts the CEL attributes it was asked to send.
const attributesKey = "envoy.filters.http.ext_proc"

// headers is a request's or response's headers, keys lower-case.
type headers map[string]string

func headersFrom(hm *corev3.HeaderMap) headers {
	h := make(headers, len(hm.GetHeaders()))
	for _, hv := range hm.GetHeaders() {
		v := hv.GetValue()
		if v == "" {
			v = string(hv.GetRawValue())
		}
		h[strings.ToLower(hv.GetKey())] = v
	}
	return h
}

// header returns one header's value from hm ("" when absent), without
// building the whole map: the meter reads two or three headers of many.
func header(hm *corev3.HeaderMap, key string) string {
	for _, hv := range hm.GetHeaders() {
		if strings.EqualFold(hv.GetKey(), key) {
			if v := hv.GetValue(); v != "" {
				return v
			}
			return string(hv.GetRawValue())
		}
	}
	return ""
}

// attributes returns the CEL attributes Envoy attached to a message.
func attributes(req *extprocv3.ProcessingRequest) map[string]*structpb.Value {
	if a := req.GetAttributes()[attributesKey]; a != nil {
		return a.GetFields()
	}
	return nil
}

// metadataFrom converts the dynamic metadata Envoy forwarded (only the
// namespaces in the filter's forwarding_namespaces; usually none).
func metadataFrom(md *corev3.Metadata) map[string]map[string]any {
	fm := md.GetFilterMetadata()
	if len(fm) == 0 {
		return nil
	}
	out := make(map[string]map[string]any, len(fm))
	for ns, st := range fm {
		out[ns] = st.AsMap()
	}
	return out
}

func attrString(attrs map[string]*structpb.Value, key string) string {
	v, ok := attrs[key]
	if !ok {
		return ""
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue
	case *structpb.Value_NumberValue:
		return strconv.FormatFloat(k.NumberValue, 'f', -1, 64)
	}
	return ""
}

// attrFloat reads a numeric attribute (a number, or a string holding one);
// NaN when absent or not a number. Callers range-check it (clampInt).
func attrFloat(attrs map[string]*structpb.Value, key string) float64 {
	switch k := attrs[key].GetKind().(type) {
	case *structpb.Value_NumberValue:
		return k.NumberValue
	case *structpb.Value_StringValue:
		if n, err := strconv.ParseFloat(k.StringValue, 64); err == nil {
			return n
		}
	}
	return math.NaN()
}

// attrTime reads a timestamp attribute (request.time, RFC 3339).
func attrTime(attrs map[string]*structpb.Value, key string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, attrString(attrs, key))
	return t
}

func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// immediate answers the request from the gate with an OpenAI-style error;
// the upstream never sees it.
func immediate(e *openai.Error, extra ...*corev3.HeaderValueOption) *extprocv3.ProcessingResponse {
	hdrs := append([]*corev3.HeaderValueOption{
		setHeader("content-type", "application/json"),
		setHeader(request.ErrorHeader, e.Code),
	}, extra...)
	return &extprocv3.ProcessingResponse{
		Response: &extprocv3.ProcessingResponse_ImmediateResponse{
			ImmediateResponse: &extprocv3.ImmediateResponse{
				Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.Status)},
				Headers: &extprocv3.HeaderMutation{SetHeaders: hdrs},
				Body:    e.JSON(),
				Details: "infergate_" + e.Code,
			},
		},
	}
}
