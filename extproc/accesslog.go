package extproc

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/infergate/infergate/internal/meter"
	"github.com/infergate/infergate/internal/request"
	"github.com/infergate/infergate/internal/wasmmeter"
)

// The in-Envoy meter's hand-off (an option; the ext_proc meter stays the
// default). cmd/infergate-meter-wasm times the stream inside Envoy and
// leaves one summary per request in Envoy's filter state; Envoy's gRPC
// access log (envoy.access_loggers.http_grpc, filter_state_objects_to_log)
// sends it here, on the ext_proc port, with what else the stamp needs: the
// gate's field (the entry's dynamic metadata), the status, the upstream,
// the cluster, the attempts, Envoy's start time. Each entry then takes the
// ext_proc meter's own finishing path (finish): the same stamp, metrics,
// span and settlement.
//
// Why the access log: it is the one channel Envoy itself sends once per
// request, after the response, batched (many entries per message, on a
// stream per worker that stays open), and it already carries the upstream
// facts. The alternatives cost more or hold less: an ext_proc filter that
// only reads the summary (trailers or attributes) is a gRPC stream per
// request again, and sees nothing once the response ended without
// trailers; a proxy_http_call from the module is an HTTP request per
// request made from inside the data path, timed and retried by the module.
// What the access log costs is latency: a stamp and a settlement arrive
// within its buffer_flush_interval (1 s by default), not at the last token.

// AccessLogService returns the service that takes the in-Envoy meter's
// summaries, to be registered on the ext_proc gRPC server, and the func
// that ends its streams, for a graceful stop: Envoy keeps an access-log
// stream open for as long as it runs, and opens another (to another
// replica, if there is one) when this one ends.
func (s *Server) AccessLogService() (accesslogv3.AccessLogServiceServer, func()) {
	a := &accessLog{s: s, stop: make(chan struct{})}
	var once sync.Once
	return a, func() { once.Do(func() { close(a.stop) }) }
}

type accessLog struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	s    *Server
	stop chan struct{}
}

// maxSummaryAge bounds how far a summary's start may lie from infergate's
// clock (Envoy's clock, on another host maybe): a stream may last a day.
const maxSummaryAge = 25 * time.Hour

// StreamAccessLogs takes one Envoy worker's entries; each is stamped as it
// comes (Envoy batches them, several per message).
func (a *accessLog) StreamAccessLogs(stream accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	// Entries are stamped apart from the stream's gRPC metadata: a span's
	// parent is the gate's (from its field), never the log stream's.
	ctx := metadata.NewIncomingContext(stream.Context(), metadata.MD{})
	msgs, errc := make(chan *accesslogv3.StreamAccessLogsMessage), make(chan error, 1)
	go func() { // ends with the stream: Recv fails once the handler returned
		for {
			msg, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- msg:
			case <-stream.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case msg := <-msgs:
			for _, e := range msg.GetHttpLogs().GetLogEntry() {
				a.s.meterEntry(ctx, e)
			}
		case err := <-errc:
			if errors.Is(err, io.EOF) {
				return stream.SendAndClose(&accesslogv3.StreamAccessLogsResponse{})
			}
			return normalClose(err)
		case <-a.stop:
			return nil
		}
	}
}

// meterEntry stamps and settles one request from its access-log entry. An
// entry without a summary is not the in-Envoy meter's (a response the gate
// answered itself, stamped there; another listener); a malformed one is
// counted and logged, and dropped.
func (s *Server) meterEntry(ctx context.Context, e *accesslogdatav3.HTTPAccessLogEntry) {
	defer func() {
		if r := recover(); r != nil {
			_ = s.recovered(ctx, "meter", r)
		}
	}()
	s.meterSummary(ctx, e)
}

func (s *Server) meterSummary(ctx context.Context, e *accesslogdatav3.HTTPAccessLogEntry) {
	c := e.GetCommonProperties()
	if t := c.GetAccessLogType(); t != accesslogdatav3.AccessLogType_NotSet && t != accesslogdatav3.AccessLogType_DownstreamEnd {
		return // a periodic flush of a request still going, or an upstream's: the final entry follows
	}
	raw, ok := filterStateString(c.GetFilterStateObjects()[wasmmeter.FilterStateKey])
	if !ok {
		return
	}
	requestID := fieldString(e.GetRequest().GetRequestId(), request.MaxStampField)
	sum, err := wasmmeter.Parse(raw)
	now := s.now()
	if err == nil && (sum.Start.Before(now.Add(-maxSummaryAge)) || sum.Start.After(now.Add(time.Minute))) {
		err = errors.New("start out of range")
	}
	if err != nil {
		s.metrics.MeterErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", "bad_summary")))
		s.log.Warn("in-Envoy meter: malformed summary; the request is neither stamped nor settled",
			"request_id", requestID, "err", err, "summary", fieldString(raw, 256))
		return
	}
	m := s.newMeterRequest()
	m.seen, m.Sent, m.EnvoyTimed = true, sum.Start, true
	m.Stamp.RequestID = requestID
	if f, fs, ok := readGateField(m.sealer, c.GetMetadata().GetFilterMetadata()[request.MeterNamespace].GetFields()[request.MeterKey].GetStringValue()); ok {
		m.fieldSeal = fs
		m.fromField(&f)
	}
	// Envoy's start, on the same clock as the summary's: kept when it is
	// before the request left, by no more than a gateway could take.
	if t := c.GetStartTime(); t.IsValid() {
		if st := t.AsTime(); !st.After(sum.Start) && sum.Start.Sub(st) <= time.Hour {
			m.EnvoyStart = st
		}
	}
	m.Stamp.Status = meter.ClampInt(float64(e.GetResponse().GetResponseCode().GetValue()), 100, 599)
	m.Stamp.Upstream = addressString(c.GetUpstreamRemoteAddress())
	m.Origin = meter.OriginOf(e.GetResponse().GetResponseCodeDetails())
	m.Stamp.Attempts = meter.ClampInt(float64(c.GetUpstreamRequestAttemptCount()), 0, meter.MaxAttempts)
	cluster := c.GetUpstreamCluster()
	if cluster == "" {
		cluster = e.GetResponse().GetResponseHeaders()[request.PoolHeader]
	}
	m.Served(m.orders.ServingPools(request.Truncate(cluster, request.MaxStampField), c.GetCustomTags()[request.PoolOrderKey], m.Stamp.Attempts))
	// What the module counted, as the ext_proc meter's own count (its End
	// finds nothing left to read). The API is the gate's, else the one
	// the module read from the response.
	t := &m.Tally
	if t.API == "" {
		t.API = meter.KnownAPI(string(sum.API))
	}
	t.SSE = sum.SSE
	if sum.HasFirst {
		t.First = sum.Start.Add(sum.TTFT)
	}
	t.ContentEvents, t.ITLMax, t.Model = sum.ContentEvents, sum.ITLMax, sum.ResponseModel
	t.Gaps = sum.Gaps[:min(len(sum.Gaps), s.opts.MaxTrackedGaps)]
	t.Usage, t.OutputOnly = sum.Usage, sum.OutputOnly
	t.Input, t.HasInput = sum.Input, sum.HasInput
	t.BadEvents, t.Parser.Dropped, t.Parser.Overflowed = sum.BadEvents, sum.Dropped, sum.Overflowed
	m.Cut = !sum.Complete // the module ends a record early only when Envoy ended the stream
	// The summary does not tell [DONE] from a stream's end: a stream
	// that reached its end (or its [DONE]) counts as ended properly.
	m.Ended = sum.SSE && sum.Complete
	s.finish(ctx, m, sum.Start.Add(sum.E2E), sum.Complete)
}

// filterStateString reads a filter state object as Envoy logs a Wasm
// property: a BytesValue (or a StringValue) in an Any.
func filterStateString(a *anypb.Any) (string, bool) {
	if a == nil {
		return "", false
	}
	var b wrapperspb.BytesValue
	if a.UnmarshalTo(&b) == nil {
		return string(b.GetValue()), true
	}
	var sv wrapperspb.StringValue
	if a.UnmarshalTo(&sv) == nil {
		return sv.GetValue(), true
	}
	return "", false
}

// addressString renders an upstream address as Envoy's upstream.address
// attribute does (host:port, or a pipe's path), bounded.
func addressString(a *corev3.Address) string {
	if sa := a.GetSocketAddress(); sa != nil {
		return request.Truncate(net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10)), request.MaxStampField)
	}
	return request.Truncate(a.GetPipe().GetPath(), request.MaxStampField)
}
