package extproc

import (
	"math"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocmodes "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/infergate/infergate/internal/request"
)

// Codec is the ext_proc server's gRPC codec (grpc.ForceServerCodecV2). It
// decodes a ProcessingRequest by hand, with protowire, into the same
// message proto.Unmarshal builds, without the generic, table-driven
// decoder: every streamed token is one such message. It takes the
// canonical encoding of the fields Envoy sends (headers, bodies, trailers,
// metadata and attributes as Structs, the observability and protocol
// fields); anything else (an unknown or repeated field, a typed metadata
// entry, invalid UTF-8, deep nesting) goes to proto.Unmarshal, so the
// result is always proto.Unmarshal's (FuzzDecodeProcessingRequest checks
// it). Every other message is grpc-go's own proto codec's.
type Codec struct{ proto encoding.CodecV2 }

// NewCodec returns the codec, falling back to grpc-go's registered one.
func NewCodec() Codec { return Codec{proto: encoding.GetCodecV2("proto")} }

// Name is the content subtype it serves: the default one.
func (Codec) Name() string { return "proto" }

// Marshal encodes an answer into a pooled buffer, returned to the pool
// once the transport wrote it; grpc-go's codec pools only messages over
// 1 KiB, and the gate's answers are smaller.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.proto.Marshal(v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // the size just computed
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*extprocv3.ProcessingRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return decodeProcessingRequest(buf.ReadOnlyData(), m)
}

// decodeProcessingRequest sets m to what b encodes. b is not retained.
func decodeProcessingRequest(b []byte, m *extprocv3.ProcessingRequest) error {
	var d wireDecoder
	if d.request(b, m) {
		return nil
	}
	return proto.Unmarshal(b, m) // resets m first
}

// maxWireDepth bounds Struct nesting decoded by hand (proto.Unmarshal
// takes the deeper ones, with its own limit).
const maxWireDepth = 32

// wireDecoder's methods report false on what they do not take, and the
// whole message then goes to proto.Unmarshal.
type wireDecoder struct{ depth int }

// fields calls f with each field of a message; it reports false on a
// malformed tag or value, or when f does.
func (d *wireDecoder) fields(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default: // fixed32 and groups: none in what Envoy sends
			return false
		}
		if n < 0 || !f(num, typ, v, x) {
			return false
		}
		b = b[n:]
	}
	return true
}

func (d *wireDecoder) request(b []byte, m *extprocv3.ProcessingRequest) bool {
	*m = extprocv3.ProcessingRequest{}
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) bool {
		if num >= 2 && num <= 7 && (typ != protowire.BytesType || m.Request != nil) {
			return false // a repeated or mixed oneof: proto.Unmarshal merges
		}
		switch num {
		case 2:
			h := &extprocv3.HttpHeaders{}
			m.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}
			return d.httpHeaders(v, h)
		case 3:
			h := &extprocv3.HttpHeaders{}
			m.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: h}
			return d.httpHeaders(v, h)
		case 4:
			h := &extprocv3.HttpBody{}
			m.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: h}
			return d.httpBody(v, h)
		case 5:
			h := &extprocv3.HttpBody{}
			m.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: h}
			return d.httpBody(v, h)
		case 6:
			h := &extprocv3.HttpTrailers{}
			m.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: h}
			return d.httpTrailers(v, h)
		case 7:
			h := &extprocv3.HttpTrailers{}
			m.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: h}
			return d.httpTrailers(v, h)
		case 8:
			if typ != protowire.BytesType || m.MetadataContext != nil {
				return false
			}
			m.MetadataContext = &corev3.Metadata{}
			return d.metadata(v, m.MetadataContext)
		case 9:
			if typ != protowire.BytesType {
				return false
			}
			if m.Attributes == nil {
				m.Attributes = map[string]*structpb.Struct{}
			}
			return d.structEntry(v, m.Attributes)
		case 10:
			if typ != protowire.VarintType {
				return false
			}
			m.ObservabilityMode = protowire.DecodeBool(x)
			return true
		case 11:
			if typ != protowire.BytesType || m.ProtocolConfig != nil {
				return false
			}
			m.ProtocolConfig = &extprocv3.ProtocolConfiguration{}
			return d.protocolConfig(v, m.ProtocolConfig)
		}
		return false
	})
}

func (d *wireDecoder) httpHeaders(b []byte, h *extprocv3.HttpHeaders) bool {
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) bool {
		switch {
		case num == 1 && typ == protowire.BytesType && h.Headers == nil:
			h.Headers = &corev3.HeaderMap{}
			return d.headerMap(v, h.Headers)
		case num == 3 && typ == protowire.VarintType:
			h.EndOfStream = protowire.DecodeBool(x)
			return true
		}
		return false // including the deprecated attributes (field 2)
	})
}

func (d *wireDecoder) headerMap(b []byte, hm *corev3.HeaderMap) bool {
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
		if num != 1 || typ != protowire.BytesType {
			return false
		}
		hv := &corev3.HeaderValue{}
		hm.Headers = append(hm.Headers, hv)
		return d.fields(v, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
			if typ != protowire.BytesType {
				return false
			}
			switch num {
			case 1:
				hv.Key = intern(v)
				return utf8.ValidString(hv.Key)
			case 2:
				hv.Value = string(v)
				return utf8.ValidString(hv.Value)
			case 3:
				hv.RawValue = append([]byte(nil), v...)
				return true
			}
			return false
		})
	})
}

func (d *wireDecoder) httpBody(b []byte, h *extprocv3.HttpBody) bool {
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) bool {
		if num == 1 {
			if typ != protowire.BytesType {
				return false
			}
			h.Body = append([]byte(nil), v...) // b is the transport's buffer, reused
			return true
		}
		if typ != protowire.VarintType {
			return false
		}
		switch num {
		case 2:
			h.EndOfStream = protowire.DecodeBool(x)
		case 3:
			h.EndOfStreamWithoutMessage = protowire.DecodeBool(x)
		case 4:
			h.GrpcMessageCompressed = protowire.DecodeBool(x)
		case 5:
			h.DrainComplete = protowire.DecodeBool(x)
		default:
			return false
		}
		return true
	})
}

func (d *wireDecoder) httpTrailers(b []byte, h *extprocv3.HttpTrailers) bool {
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
		if num != 1 || typ != protowire.BytesType || h.Trailers != nil {
			return false
		}
		h.Trailers = &corev3.HeaderMap{}
		return d.headerMap(v, h.Trailers)
	})
}

func (d *wireDecoder) metadata(b []byte, md *corev3.Metadata) bool {
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
		if num != 1 || typ != protowire.BytesType { // typed_filter_metadata (Any): proto.Unmarshal
			return false
		}
		if md.FilterMetadata == nil {
			md.FilterMetadata = map[string]*structpb.Struct{}
		}
		return d.structEntry(v, md.FilterMetadata)
	})
}

func (d *wireDecoder) protocolConfig(b []byte, pc *extprocv3.ProtocolConfiguration) bool {
	return d.fields(b, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) bool {
		if typ != protowire.VarintType {
			return false
		}
		switch num {
		case 1:
			pc.RequestBodyMode = extprocmodes.ProcessingMode_BodySendMode(int32(x))
		case 2:
			pc.ResponseBodyMode = extprocmodes.ProcessingMode_BodySendMode(int32(x))
		case 3:
			pc.SendBodyWithoutWaitingForHeaderResponse = protowire.DecodeBool(x)
		default:
			return false
		}
		return true
	})
}

// mapEntry splits a map entry into its key and its value's bytes; a
// missing key is "" and a missing value an empty message, as proto's.
func (d *wireDecoder) mapEntry(b []byte) (key string, val []byte, ok bool) {
	seenKey, seenVal := false, false
	ok = d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
		if typ != protowire.BytesType {
			return false
		}
		switch {
		case num == 1 && !seenKey:
			key, seenKey = intern(v), true
			return utf8.ValidString(key)
		case num == 2 && !seenVal:
			val, seenVal = v, true
			return true
		}
		return false // a repeated key or value: proto.Unmarshal merges
	})
	return key, val, ok
}

// structEntry decodes one map<string, Struct> entry into into.
func (d *wireDecoder) structEntry(b []byte, into map[string]*structpb.Struct) bool {
	key, val, ok := d.mapEntry(b)
	if !ok {
		return false
	}
	s := &structpb.Struct{}
	into[key] = s
	return d.structValue(val, s)
}

func (d *wireDecoder) structValue(b []byte, s *structpb.Struct) bool {
	if d.depth++; d.depth > maxWireDepth {
		return false
	}
	defer func() { d.depth-- }()
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
		if num != 1 || typ != protowire.BytesType {
			return false
		}
		key, val, ok := d.mapEntry(v)
		if !ok {
			return false
		}
		if s.Fields == nil {
			s.Fields = map[string]*structpb.Value{}
		}
		value := &structpb.Value{}
		s.Fields[key] = value
		return d.value(val, value)
	})
}

func (d *wireDecoder) value(b []byte, val *structpb.Value) bool {
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) bool {
		if val.Kind != nil {
			return false // a repeated kind: proto.Unmarshal merges or replaces
		}
		switch {
		case num == 1 && typ == protowire.VarintType:
			val.Kind = &structpb.Value_NullValue{NullValue: structpb.NullValue(int32(x))}
		case num == 2 && typ == protowire.Fixed64Type:
			val.Kind = &structpb.Value_NumberValue{NumberValue: math.Float64frombits(x)}
		case num == 3 && typ == protowire.BytesType:
			s := string(v)
			val.Kind = &structpb.Value_StringValue{StringValue: s}
			return utf8.ValidString(s)
		case num == 4 && typ == protowire.VarintType:
			val.Kind = &structpb.Value_BoolValue{BoolValue: protowire.DecodeBool(x)}
		case num == 5 && typ == protowire.BytesType:
			st := &structpb.Struct{}
			val.Kind = &structpb.Value_StructValue{StructValue: st}
			return d.structValue(v, st)
		case num == 6 && typ == protowire.BytesType:
			l := &structpb.ListValue{}
			val.Kind = &structpb.Value_ListValue{ListValue: l}
			return d.listValue(v, l)
		default:
			return false
		}
		return true
	})
}

func (d *wireDecoder) listValue(b []byte, l *structpb.ListValue) bool {
	if d.depth++; d.depth > maxWireDepth {
		return false
	}
	defer func() { d.depth-- }()
	return d.fields(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) bool {
		if num != 1 || typ != protowire.BytesType {
			return false
		}
		val := &structpb.Value{}
		l.Values = append(l.Values, val)
		return d.value(v, val)
	})
}

// intern returns the names Envoy sends on every request (the attributes
// the shipped configs ask for, the headers the meter and gate read)
// without allocating; any other as a new string.
func intern(b []byte) string {
	switch string(b) { // no allocation: the compiler compares in place
	case attributesKey:
		return attributesKey
	case request.MeterAttribute:
		return request.MeterAttribute
	case request.PoolOrderAttribute:
		return request.PoolOrderAttribute
	case "request.time":
		return "request.time"
	case "response.code":
		return "response.code"
	case "upstream.address":
		return "upstream.address"
	case "xds.cluster_name":
		return "xds.cluster_name"
	case "upstream.request_attempt_count":
		return "upstream.request_attempt_count"
	case "response.code_details":
		return "response.code_details"
	case ":status":
		return ":status"
	case ":method":
		return ":method"
	case ":path":
		return ":path"
	case "content-type":
		return "content-type"
	case "x-request-id":
		return "x-request-id"
	case "authorization":
		return "authorization"
	case "user-agent":
		return "user-agent"
	case request.ModelHeader:
		return request.ModelHeader
	case request.PoolHeader:
		return request.PoolHeader
	}
	return string(b)
}
