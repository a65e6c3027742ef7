package gloo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/cpcache/cpcache/parallel"
)

// userKV is the kv of a parallel.Store the caller runs (Options.Rendezvous: an engine's
// torch.distributed.Store through the C ABI's callbacks). Every key it writes starts with the
// spec's prefix ("cpcache/"), so the caller's own keys are never touched.
//
// Each call of the caller's store runs in a goroutine of its own and is abandoned when its
// context ends first: a store that hangs ends the call at its deadline (the goroutine stays
// until the store returns, and its result is dropped).
//
// A create is a counter: key+"#created" incremented to 1 makes the caller the creator, which
// then writes key (a reader polls for key, and sees it once it is written).
//
// A claim is a chain of generations (the file store's scheme over a store without
// compare-and-set): generation g of claim key k is taken by the process whose
// Add(k/g<g>#take, 1) returns 1, which then writes its value to k/g<g> and the hint k/hint = g
// (where the next claimer starts). A generation is live while it has a value that has not
// expired and no release marker k/g<g>#done; a claimer walks from the hint over released and
// expired generations to the first free one. A generation taken but without a value after
// claimValueWait is a taker that died between its two calls: it is walked over, and both
// sides check afterwards (a taker that finds a later generation taken, or the hint past its
// own, gives up its generation; one that walked over a generation without a value and finds
// it live now gives up its own), so two live claims never stand.
type userKV struct{ s parallel.Store }

// claimValueWait is how long a claimer waits for the value of a generation that is taken
// but not yet written before it takes its taker for dead.
const claimValueWait = 2 * time.Second

// userWaitChunk bounds one Get-with-wait of the caller's store, so that a context's end
// (a cancelled rendezvous) is noticed between two.
const userWaitChunk = time.Second

// callStore runs fn in a goroutine and returns its result, or ctx's error when ctx ends
// first (fn is abandoned: its result is dropped when it returns).
func callStore[T any](ctx context.Context, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- result{err: fmt.Errorf("rendezvous store: panic: %v", r)}
			}
		}()
		v, err := fn(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

type getResult struct {
	v  []byte
	ok bool
}

// getWait reads key, waiting up to wait for it.
func (u *userKV) getWait(ctx context.Context, key string, wait time.Duration) ([]byte, bool, error) {
	r, err := callStore(ctx, func(ctx context.Context) (getResult, error) {
		v, ok, err := u.s.Get(ctx, key, wait)
		return getResult{v, ok}, err
	})
	return r.v, r.ok, err
}

func (u *userKV) add(ctx context.Context, key string, delta int64) (int64, error) {
	return callStore(ctx, func(ctx context.Context) (int64, error) { return u.s.Add(ctx, key, delta) })
}

func (u *userKV) set(ctx context.Context, key string, val []byte) error {
	_, err := callStore(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, u.s.Set(ctx, key, val) })
	return err
}

func (u *userKV) delete(ctx context.Context, key string) error {
	_, err := callStore(ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, u.s.Delete(ctx, key) })
	return err
}

func (u *userKV) put(ctx context.Context, key string, val []byte) error { return u.set(ctx, key, val) }

func (u *userKV) create(ctx context.Context, key string, val []byte) (bool, error) {
	n, err := u.add(ctx, key+"#created", 1)
	if err != nil || n != 1 {
		return false, err
	}
	return true, u.set(ctx, key, val)
}

func (u *userKV) get(ctx context.Context, key string) ([]byte, bool, error) {
	return u.getWait(ctx, key, 0)
}

// wait waits for key (pollWait): Get-with-wait calls of at most userWaitChunk until ctx ends.
func (u *userKV) wait(ctx context.Context, key string) ([]byte, error) {
	for {
		chunk := userWaitChunk
		if d, ok := ctx.Deadline(); ok {
			chunk = min(chunk, time.Until(d))
		}
		if chunk <= 0 {
			return nil, context.DeadlineExceeded
		}
		v, ok, err := u.getWait(ctx, key, chunk)
		if err != nil {
			return nil, err
		}
		if ok {
			return v, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
}

func (u *userKV) del(ctx context.Context, keys ...string) error {
	var errs []error
	for _, k := range keys {
		if err := u.delete(ctx, k); err != nil {
			errs = append(errs, err)
		}
		if err := u.delete(ctx, k+"#created"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func genKey(key string, g int64) string { return key + "/g" + strconv.FormatInt(g, 10) }

// hint is where a walk of claim key's generations starts (at least 1).
func (u *userKV) hint(ctx context.Context, key string) (int64, error) {
	v, ok, err := u.get(ctx, key+"/hint")
	if err != nil || !ok {
		return 1, err
	}
	g, perr := strconv.ParseInt(string(v), 10, 64)
	if perr != nil || g < 1 {
		return 1, nil
	}
	return g, nil
}

// genState reads generation g of claim key: whether it is taken, its value (waiting up to
// wait for a taken one's) and whether it is live (a value, not expired, not released).
func (u *userKV) genState(ctx context.Context, key string, g int64, wait time.Duration) (taken bool, val []byte, live bool, err error) {
	gk := genKey(key, g)
	n, err := u.add(ctx, gk+"#take", 0)
	if err != nil || n == 0 {
		return false, nil, false, err
	}
	v, ok, err := u.getWait(ctx, gk, 0)
	if err == nil && !ok && wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, wait)
		v, err = u.wait(wctx, gk)
		cancel()
		ok = err == nil
		if err != nil && ctx.Err() == nil {
			err = nil // the value did not come: a taker that died
		}
	}
	if err != nil || !ok {
		return true, nil, false, err
	}
	if claimExpired(v, time.Now()) {
		return true, v, false, nil
	}
	_, released, err := u.get(ctx, gk+"#done")
	return true, v, err == nil && !released, err
}

// later reports whether a claimer went past generation g: g+1 is taken, or the hint is
// beyond g.
func (u *userKV) later(ctx context.Context, key string, g int64) (bool, error) {
	n, err := u.add(ctx, genKey(key, g+1)+"#take", 0)
	if err != nil || n != 0 {
		return n != 0, err
	}
	h, err := u.hint(ctx, key)
	return h > g, err
}

func (u *userKV) claim(ctx context.Context, key string, val []byte, expiry time.Time) (bool, []byte, error) {
	start, err := u.hint(ctx, key)
	if err != nil {
		return false, nil, err
	}
	g, skipped := start, false // skipped: generation g-1 had no value when this walk went past it
	for ctx.Err() == nil {
		gk := genKey(key, g)
		n, err := u.add(ctx, gk+"#take", 1)
		if err != nil {
			return false, nil, err
		}
		if n == 1 {
			if err := u.set(ctx, gk, val); err != nil {
				return false, nil, err
			}
			past, err := u.later(ctx, key, g)
			if err != nil {
				return false, nil, err
			}
			if past { // g is not the head: give it up and walk on
				if err := u.set(ctx, gk+"#done", []byte("1")); err != nil {
					return false, nil, err
				}
				g, skipped = g+1, false
				continue
			}
			if skipped {
				if _, prev, live, err := u.genState(ctx, key, g-1, 0); err != nil || live {
					_ = u.set(ctx, gk+"#done", []byte("1"))
					return false, prev, err
				}
			}
			if err := u.set(ctx, key+"/hint", []byte(strconv.FormatInt(g, 10))); err != nil {
				return false, nil, err
			}
			// The generations walked over are over: remove them (a late taker of one finds
			// the hint past it and gives it up).
			for old := start; old < g; old++ {
				ok := genKey(key, old)
				for _, k := range []string{ok, ok + "#take", ok + "#done"} {
					_ = u.delete(ctx, k)
				}
			}
			return true, nil, nil
		}
		_, cur, live, err := u.genState(ctx, key, g, claimValueWait)
		if err != nil {
			return false, nil, err
		}
		if live {
			past, err := u.later(ctx, key, g)
			if err != nil {
				return false, nil, err
			}
			if !past {
				return false, cur, nil
			}
		}
		g, skipped = g+1, cur == nil
	}
	return false, nil, ctx.Err()
}

func (u *userKV) claimed(ctx context.Context, key string) ([]byte, bool, error) {
	g, err := u.hint(ctx, key)
	if err != nil {
		return nil, false, err
	}
	for ; ctx.Err() == nil; g++ {
		taken, v, live, err := u.genState(ctx, key, g, 0)
		if err != nil || !taken {
			return nil, false, err
		}
		if live {
			return v, true, nil
		}
	}
	return nil, false, ctx.Err()
}

func (u *userKV) release(ctx context.Context, key string, val []byte) error {
	g, err := u.hint(ctx, key)
	if err != nil {
		return err
	}
	for ; ctx.Err() == nil; g++ {
		taken, v, _, err := u.genState(ctx, key, g, 0)
		if err != nil || !taken {
			return err
		}
		if bytes.Equal(v, val) {
			return u.set(ctx, genKey(key, g)+"#done", []byte("1"))
		}
	}
	return ctx.Err()
}

// reap does nothing: the keys of a run are removed by its ranks at close, and the caller's
// store is the caller's (an engine's TCPStore lives as long as the engine).
func (u *userKV) reap(context.Context, string, string, time.Duration) error { return nil }

// close leaves the caller's store open: it is the caller's.
func (u *userKV) close() error { return nil }

// waiter is a kv that waits for a key itself (pollWait uses it instead of polling).
type waiter interface {
	wait(ctx context.Context, key string) ([]byte, error)
}

var _ waiter = (*userKV)(nil)
