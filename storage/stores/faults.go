package stores

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/cpcache/cpcache/storage"
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
	// Freeze makes the directory backend's file system operations block where the kernel
	// would on a frozen or dead file system (fsfreeze, a hung NFS or FUSE mount): ignoring
	// the call's context, until the fault's window ends (For; 0: until the storage returned
	// by WithFaults is closed or thawed, see Thaw). The calls themselves still return at their deadline, the
	// operations abandoned (Stats.Abandoned). Other backends make no file system operations:
	// Freeze changes nothing there. Freeze takes precedence over Hang.
	Freeze bool
	// Ops limits the fault to these operations ("exists", "get", "put", "delete", "clear");
	// empty: every operation.
	Ops []string
}

// WithFaults returns st with f injected; Close and Stats pass through.
func WithFaults(st storage.Storage, f Faults) storage.Storage {
	s := &faulty{Storage: st, f: f, start: time.Now(), thaw: make(chan struct{})}
	if f.Freeze {
		if b := baseOf(st); b != nil {
			b.kernel.addGate(s.freeze)
		}
	}
	return s
}

type faulty struct {
	storage.Storage
	f         Faults
	start     time.Time
	thaw      chan struct{} // closed by Close: a freeze without an end ends
	closeOnce sync.Once
}

// baseOf returns the base of the backend under st's fault wrappers, or nil.
func baseOf(st storage.Storage) *base {
	for {
		switch s := st.(type) {
		case *faulty:
			st = s.Storage
		case interface{ common() *base }:
			return s.common()
		default:
			return nil
		}
	}
}

// active reports whether the fault applies to op now.
func (s *faulty) active(op string) bool {
	since := time.Since(s.start)
	return since >= s.f.After && (s.f.For == 0 || since < s.f.After+s.f.For) && (len(s.f.Ops) == 0 || slices.Contains(s.f.Ops, op))
}

// freeze is the gate of a Freeze fault: run by a detached file system operation before it
// starts, it blocks, whatever the operation's context, until the window ends.
func (s *faulty) freeze(op string) {
	if !s.active(op) {
		return
	}
	if s.f.For == 0 {
		<-s.thaw
		return
	}
	t := time.NewTimer(time.Until(s.start.Add(s.f.After + s.f.For)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.thaw:
	}
}

// Thaw ends the fault's Freeze now: the frozen operations go on (tests; the storage
// WithFaults returns has it: st.(interface{ Thaw() }).Thaw()).
func (s *faulty) Thaw() { s.closeOnce.Do(func() { close(s.thaw) }) }

// Close thaws (Thaw) and closes st.
func (s *faulty) Close() error {
	s.Thaw()
	return s.Storage.Close()
}

// inject returns the injected failure of op now, or nil.
func (s *faulty) inject(ctx context.Context, op string) error {
	if s.f.Freeze || !s.active(op) {
		return nil
	}
	cause := ErrInjected
	if s.f.Hang {
		<-ctx.Done()
		cause = errors.Join(ErrInjected, ctx.Err())
	}
	return &storage.OpError{Backend: "faulty", Op: op, Kind: storage.ErrUnavailable, Err: cause}
}

func (s *faulty) Exists(ctx context.Context, keys []storage.Key, present []bool) (int, error) {
	if err := s.inject(ctx, "exists"); err != nil {
		return 0, err
	}
	return s.Storage.Exists(ctx, keys, present)
}

func (s *faulty) Get(ctx context.Context, keys []storage.Key, dst [][]byte, found []bool) (int, error) {
	if err := s.inject(ctx, "get"); err != nil {
		return 0, err
	}
	return s.Storage.Get(ctx, keys, dst, found)
}

func (s *faulty) GetBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	if err := s.inject(ctx, "get"); err != nil {
		return 0, err
	}
	return s.Storage.GetBound(ctx, keys, binds, dst, found)
}

func (s *faulty) Put(ctx context.Context, keys []storage.Key, src [][]byte) error {
	if err := s.inject(ctx, "put"); err != nil {
		return err
	}
	return s.Storage.Put(ctx, keys, src)
}

func (s *faulty) PutBound(ctx context.Context, keys []storage.Key, binds []storage.Binding, src [][]byte) error {
	if err := s.inject(ctx, "put"); err != nil {
		return err
	}
	return s.Storage.PutBound(ctx, keys, binds, src)
}

func (s *faulty) Delete(ctx context.Context, keys []storage.Key) error {
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
