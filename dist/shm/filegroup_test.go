package shm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cpcache/cpcache/dist"
)

// fileGroup is a test-only bootstrap group for multi-process tests: every collective is an
// exchange of files in a shared directory (write to a temporary name, rename, poll for the
// peers' files). It is slow, has no peer-loss detection beyond its timeout, and exists so
// that the shared-memory group can be tested across real processes without another backend.
type fileGroup struct {
	dir        string
	rank, size int
	timeout    time.Duration
	seq        int
}

func newFileGroup(dir string, rank, size int) *fileGroup {
	return &fileGroup{dir: dir, rank: rank, size: size, timeout: time.Minute}
}

func (f *fileGroup) Rank() int    { return f.rank }
func (f *fileGroup) Size() int    { return f.size }
func (f *fileGroup) Name() string { return dist.GroupName("file", f.Ranks()) }
func (f *fileGroup) Close() error { return nil }

func (f *fileGroup) Ranks() []int {
	r := make([]int, f.size)
	for i := range r {
		r[i] = i
	}
	return r
}

func (f *fileGroup) exchange(ctx context.Context, op string, data []byte) ([][]byte, error) {
	seq := f.seq
	f.seq++
	name := func(r int) string { return filepath.Join(f.dir, fmt.Sprintf("%06d.%s.%d", seq, op, r)) }
	tmp := name(f.rank) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, name(f.rank)); err != nil {
		return nil, err
	}
	deadline := dist.Deadline(ctx, f.timeout)
	parts := make([][]byte, f.size)
	for r := range f.size {
		for {
			b, err := os.ReadFile(name(r))
			if err == nil {
				parts[r] = b
				break
			}
			if !os.IsNotExist(err) {
				return nil, err
			}
			if time.Now().After(deadline) {
				return nil, &dist.OpError{Group: f.Name(), Rank: f.rank, Op: op, Seq: uint64(seq),
					Err: fmt.Errorf("%w: member %d did not arrive", dist.ErrTimeout, r)}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return parts, nil
}

func (f *fileGroup) AllReduce(ctx context.Context, op dist.ReduceOp, vals []int64) error {
	buf := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint64(buf[8*i:], uint64(v))
	}
	parts, err := f.exchange(ctx, "allreduce", buf)
	if err != nil {
		return err
	}
	acc := make([]int64, len(vals))
	for r, p := range parts {
		if len(p) != len(buf) {
			return fmt.Errorf("filegroup: member %d reduced %d bytes, want %d", r, len(p), len(buf))
		}
		v := make([]int64, len(vals))
		for i := range v {
			v[i] = int64(binary.LittleEndian.Uint64(p[8*i:]))
		}
		if r == 0 {
			copy(acc, v)
		} else {
			op.Apply(acc, v)
		}
	}
	copy(vals, acc)
	return nil
}

func (f *fileGroup) Broadcast(ctx context.Context, root int, data []byte) ([]byte, error) {
	if f.rank != root {
		data = nil
	}
	parts, err := f.exchange(ctx, "broadcast", data)
	if err != nil {
		return nil, err
	}
	return parts[root], nil
}

func (f *fileGroup) AllGather(ctx context.Context, data []byte) ([][]byte, error) {
	return f.exchange(ctx, "allgather", data)
}

func (f *fileGroup) Barrier(ctx context.Context) error {
	_, err := f.exchange(ctx, "barrier", nil)
	return err
}
