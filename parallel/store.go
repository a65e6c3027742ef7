package parallel

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Store is a key-value store the caller already runs for its own rendezvous (an engine's
// torch.distributed.Store: TCPStore, FileStore, PrefixStore), which the ranks of a job meet
// through instead of a store URL. It offers what torch.distributed.Store offers: set,
// get with a wait (get/wait/check), add, delete_key.
//
// Its methods may be called from several goroutines at once. A call should end by its
// context's deadline; one that does not is abandoned there (the caller goes on, and the
// call's result is dropped when it returns).
type Store interface {
	// Set creates or replaces key.
	Set(ctx context.Context, key string, value []byte) error
	// Get returns key's value, waiting up to wait for the key to appear (0: no wait); ok is
	// false when it is still absent then.
	Get(ctx context.Context, key string, wait time.Duration) (value []byte, ok bool, err error)
	// Add adds delta to the counter at key (an absent key counts as 0) and returns the new
	// value; Add(key, 0) reads it. A counter's value is its decimal text (as torch's stores keep it).
	Add(ctx context.Context, key string, delta int64) (int64, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
}

// MemStore is a Store in this process's memory: for the ranks of one process (tests) and as
// the reference of Store's semantics. The zero value is ready to use.
type MemStore struct {
	mu      sync.Mutex
	m       map[string][]byte
	changed chan struct{} // closed and replaced at every write (wakes Get's waiters)
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{} }

func (s *MemStore) lockedInit() {
	if s.m == nil {
		s.m = map[string][]byte{}
	}
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
}

func (s *MemStore) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockedInit()
	s.m[key] = append([]byte(nil), value...)
	s.notify()
	return nil
}

func (s *MemStore) Get(ctx context.Context, key string, wait time.Duration) ([]byte, bool, error) {
	var timer <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timer = t.C
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		s.mu.Lock()
		s.lockedInit()
		v, ok := s.m[key]
		changed := s.changed
		s.mu.Unlock()
		if ok {
			return append([]byte(nil), v...), true, nil
		}
		if timer == nil {
			return nil, false, nil
		}
		select {
		case <-changed:
		case <-timer:
			return nil, false, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

func (s *MemStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockedInit()
	var n int64
	if v, ok := s.m[key]; ok {
		var err error
		if n, err = strconv.ParseInt(string(v), 10, 64); err != nil {
			return 0, fmt.Errorf("parallel: add to %q: its value %q is not a counter", key, v)
		}
	}
	n += delta
	s.m[key] = []byte(strconv.FormatInt(n, 10))
	s.notify()
	return n, nil
}

func (s *MemStore) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lockedInit()
	delete(s.m, key)
	return nil
}

// Keys returns the keys the store holds now (tests: what a job left behind).
func (s *MemStore) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.m))
	for k := range s.m {
		keys = append(keys, k)
	}
	return keys
}
