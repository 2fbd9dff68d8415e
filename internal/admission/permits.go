package admission

import (
	"context"

	"github.com/infergate/infergate/internal/request"
)

// Permits reports whether the caller would be admitted with a, as far as
// its identity and the policy's allow go: no budget is reserved and no
// check runs. The gate asks it per model to list those a caller may call
// (GET /v1/models). In shadow mode every request is admitted, so every
// model is.
func (c *Controller) Permits(ctx context.Context, a *request.Admission) bool {
	p, err := c.identify(a)
	switch {
	case err != nil:
		return false
	case c.Shadow:
		return true
	case c.Policy == nil:
		return a.Completion
	}
	d, err := c.Policy.Decide(ctx, c.input(a, &p))
	return err == nil && d.Allow
}
