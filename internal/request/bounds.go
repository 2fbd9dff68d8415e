package request

import "unicode/utf8"

// What a client or a pool controls is bounded before a stamp is stored
// anywhere (request log, /debug/requests, spans, metrics, the controller's
// feed): a request with a huge model name or a pool answering with a huge
// upstream header costs a few hundred bytes, not megabytes. Every adapter
// bounds its stamps with Bound before a sink sees them.

// Bounds of stamp fields.
const (
	MaxStampField  = 256  // ids, names, addresses
	MaxStampReason = 1024 // a policy's reason
	MaxPoolsTried  = 16   // more attempts than any retry policy makes
)

// Bound truncates every free-text field of st in place.
func (st *Stamp) Bound() {
	for _, f := range []*string{&st.RequestID, &st.TraceID, &st.Principal, &st.Tenant, &st.Model,
		&st.ResponseModel, &st.Pool, &st.Upstream, &st.Endpoint, &st.TokenSource, &st.Decision} {
		*f = Truncate(*f, MaxStampField)
	}
	st.Reason = Truncate(st.Reason, MaxStampReason)
	if len(st.PoolsTried) > MaxPoolsTried {
		st.PoolsTried = st.PoolsTried[len(st.PoolsTried)-MaxPoolsTried:]
	}
	for i := range st.PoolsTried {
		st.PoolsTried[i] = Truncate(st.PoolsTried[i], MaxStampField)
	}
}

// Truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
