package storage

import (
	"context"
	"errors"
	"slices"
	"time"
)

// ErrInjected is wrapped (with ErrUnavailable) by the failures a Faults wrapper injects.
var ErrInjected = errors.New("storage: injected fault")

// Faults are failpoints of a storage, for tests and for rehearsing a deployment's failure
// handling (cpcache run --fault storage-hang:... / storage-error:...).
type Faults struct {
	// After is how long after WithFaults the fault starts; For how long it lasts (0: until
	// the storage is closed).
	After, For time.Duration
	// Hang makes a faulty call block until its context ends (a stopped server that still
	// accepts connections); otherwise it fails at once (a refused connection). Either way it
	// returns an *OpError wrapping ErrUnavailable and ErrInjected.
	Hang bool
	// Ops limits the fault to these operations ("exists", "get", "put", "delete", "clear");
	// empty: every operation.
	Ops []string
}

// WithFaults returns st with f injected; Close and Stats pass through.
func WithFaults(st Storage, f Faults) Storage {
	return &faulty{Storage: st, f: f, start: time.Now()}
}

type faulty struct {
	Storage
	f     Faults
	start time.Time
}

// inject returns the injected failure of op now, or nil.
func (s *faulty) inject(ctx context.Context, op string) error {
	since := time.Since(s.start)
	if since < s.f.After || s.f.For > 0 && since >= s.f.After+s.f.For || len(s.f.Ops) > 0 && !slices.Contains(s.f.Ops, op) {
		return nil
	}
	cause := ErrInjected
	if s.f.Hang {
		<-ctx.Done()
		cause = errors.Join(ErrInjected, ctx.Err())
	}
	return &OpError{Backend: "faulty", Op: op, Kind: ErrUnavailable, Err: cause}
}

func (s *faulty) Exists(ctx context.Context, keys []Key, present []bool) (int, error) {
	if err := s.inject(ctx, "exists"); err != nil {
		return 0, err
	}
	return s.Storage.Exists(ctx, keys, present)
}

func (s *faulty) Get(ctx context.Context, keys []Key, dst [][]byte, found []bool) (int, error) {
	if err := s.inject(ctx, "get"); err != nil {
		return 0, err
	}
	return s.Storage.Get(ctx, keys, dst, found)
}

func (s *faulty) Put(ctx context.Context, keys []Key, src [][]byte) error {
	if err := s.inject(ctx, "put"); err != nil {
		return err
	}
	return s.Storage.Put(ctx, keys, src)
}

func (s *faulty) Delete(ctx context.Context, keys []Key) error {
	if err := s.inject(ctx, "delete"); err != nil {
		return err
	}
	return s.Storage.Delete(ctx, keys)
}

func (s *faulty) Clear(ctx context.Context) error {
	if err := s.inject(ctx, "clear"); err != nil {
		return err
	}
	return s.Storage.Clear(ctx)
}
