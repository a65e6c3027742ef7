package grouptest

import "sync"

// Parallel runs fn(rank) for rank 0..n-1 on n goroutines and returns the errors by rank.
func Parallel(n int, fn func(rank int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}
