package stores

import (
	"context"
	"sync"

	"github.com/cpcache/cpcache/storage"
)

// memStore is the process-local backend (mem://name), for tests and single-process use.
// Every Open of the same name shares one table, as instances share a directory or a Redis.
// Values are kept in the on-storage format, so corruption can be injected and is detected
// exactly as on the other backends.
type memStore struct {
	base
	table *memTable
}

type memTable struct {
	auth *storage.MAC           // the table's random MAC key, for stores opened without one
	mu   sync.Mutex             // protects vals
	vals map[storage.Key][]byte // header + payload
}

var (
	memTablesMu sync.Mutex // protects memTables
	memTables   = map[string]*memTable{}
)

func openMem(name string, opts options) *memStore {
	memTablesMu.Lock()
	t := memTables[name]
	if t == nil {
		t = &memTable{auth: storage.NewRandomMAC(), vals: map[storage.Key][]byte{}}
		memTables[name] = t
	}
	memTablesMu.Unlock()
	if opts.auth == nil {
		opts.auth = t.auth
	}
	return &memStore{base: base{backend: "mem", where: name, ns: opts.Namespace.ID(), opts: opts}, table: t}
}

func (s *memStore) Exists(_ context.Context, keys []storage.Key, present []bool) (int, error) {
	if err := s.begin("exists", keys, nil, present); err != nil {
		return 0, err
	}
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	return lookupEach(len(keys), present, func(i int) bool {
		_, ok := s.table.vals[keys[i]]
		return ok
	}), nil
}

// lookupEach sets out[i] = hit(i) for every key and returns the number of leading hits; with
// out == nil it stops at the first miss.
func lookupEach(n int, out []bool, hit func(i int) bool) int {
	lead := n
	for i := range n {
		ok := hit(i)
		if out != nil {
			out[i] = ok
		}
		if !ok && lead == n {
			lead = i
			if out == nil {
				break
			}
		}
	}
	return lead
}

func (s *memStore) Get(ctx context.Context, keys []storage.Key, dst [][]byte, found []bool) (int, error) {
	return s.GetBound(ctx, keys, nil, dst, found)
}

func (s *memStore) GetBound(_ context.Context, keys []storage.Key, binds []storage.Binding, dst [][]byte, found []bool) (int, error) {
	if err := s.checkBinds("get", keys, binds); err != nil {
		return 0, err
	}
	dst = buffers(dst)
	if err := s.begin("get", keys, dst, found); err != nil {
		return 0, err
	}
	return lookupEach(len(keys), found, func(i int) bool { return s.getOne(keys[i], bindAt(binds, i), dst[i]) }), nil
}

func (s *memStore) getOne(k storage.Key, bind *storage.Binding, dst []byte) bool {
	s.table.mu.Lock()
	v, ok := s.table.vals[k]
	s.table.mu.Unlock()
	if !ok {
		s.stats.misses.Add(1)
		return false
	}
	if err := s.decodeValue(v, k, bind, dst); err != nil {
		s.corrupt(k, err)
		return false
	}
	s.stats.hits.Add(1)
	s.stats.bytesRead.Add(uint64(len(dst)))
	return true
}

func (s *memStore) Put(ctx context.Context, keys []storage.Key, src [][]byte) error {
	return s.PutBound(ctx, keys, nil, src)
}

func (s *memStore) PutBound(_ context.Context, keys []storage.Key, binds []storage.Binding, src [][]byte) error {
	if err := s.checkBinds("put", keys, binds); err != nil {
		return err
	}
	src = buffers(src)
	if err := s.begin("put", keys, src, nil); err != nil {
		return err
	}
	for i, k := range keys {
		v := make([]byte, storage.StoredLen(len(src[i])))
		s.encodeValue(v, k, bindAt(binds, i), src[i])
		s.table.mu.Lock()
		s.table.vals[k] = v
		s.table.mu.Unlock()
		s.stats.puts.Add(1)
		s.stats.bytesWritten.Add(uint64(len(src[i])))
	}
	return nil
}

func (s *memStore) Delete(_ context.Context, keys []storage.Key) error {
	if err := s.begin("delete", keys, nil, nil); err != nil {
		return err
	}
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	for _, k := range keys {
		delete(s.table.vals, k)
		s.stats.deletes.Add(1)
	}
	return nil
}

func (s *memStore) Clear(_ context.Context) error {
	if err := s.begin("clear", nil, nil, nil); err != nil {
		return err
	}
	s.table.mu.Lock()
	defer s.table.mu.Unlock()
	for k := range s.table.vals {
		if k.NamespaceID() == s.ns {
			delete(s.table.vals, k)
		}
	}
	return nil
}

func (s *memStore) Close() error {
	if s == nil {
		return nil
	}
	s.closed.Store(true)
	return nil
}
