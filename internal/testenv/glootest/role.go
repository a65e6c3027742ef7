package glootest

import (
	"context"
	"time"

	"github.com/cpcache/cpcache/gloo"
)

// Role returns a multiproc role function that joins the Gloo world of the rank process
// with the given collective timeout, runs fn on it with a background context, and closes
// the world afterwards.
func Role(timeout time.Duration, fn func(ctx context.Context, world *gloo.Group) error) func() error {
	return func() error {
		ctx := context.Background()
		world, err := gloo.NewWorld(ctx, gloo.Options{Timeout: timeout})
		if err != nil {
			return err
		}
		defer world.Close()
		return fn(ctx, world)
	}
}
