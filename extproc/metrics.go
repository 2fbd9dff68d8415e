package extproc

import (
	"context"

	"github.com/infergate/infergate/internal/request"
)

// record hands st to every sink; the caller has bounded it (request.Stamp.Bound).
func (s *Server) record(ctx context.Context, st *request.Stamp) {
	for _, sink := range s.sinks {
		sink.Record(ctx, st)
	}
}
