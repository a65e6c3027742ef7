package stores_test

import "github.com/redis/go-redis/v9/logging"

// go-redis logs failed dials to stderr; the tests that kill servers provoke many, and the
// errors the storage returns already say it.
func init() { logging.Disable() }
