package cudaslab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/cuda/cudatest"
	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/testenv/glootest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
	"github.com/cpcache/cpcache/slab"
)

func TestMain(m *testing.M) { multiproc.Main(m) }

func init() {
	multiproc.Register("slab-cuda-ipc", glootest.Role(30*time.Second, roleCUDAIPC))
}

// requireCUDA opens the CUDA backend or skips (fails under CPCACHE_REQUIRE_GPU=1).
func requireCUDA(t *testing.T) *Backend {
	t.Helper()
	c, err := Open(0)
	if err == nil {
		if _, err = c.Device(0); err != nil {
			c.Close()
		}
	}
	if err != nil {
		cudatest.Unavailable(t, err.Error())
		return nil
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cuda backend: %v", err)
		}
	})
	return c
}

func TestCUDAPinnedHostSlabsAreDeviceVisible(t *testing.T) {
	c := requireCUDA(t)
	dev, _ := c.Device(0)
	tag := uniqueTag(t)
	errs := runMembers(2, func(g parallel.Group) error {
		spec := c.Spec(hostSpec(tag))
		spec.PinHost = true
		s, err := slab.OpenSet(context.Background(), g, spec)
		if err != nil {
			return err
		}
		defer s.Close()
		me := g.Rank()
		want := bytes.Repeat([]byte{byte(0xA0 + me)}, spec.PageSize)
		if err := s.WritePage(slab.Page{Slab: me, Index: 2}, want); err != nil {
			return err
		}
		if err := g.Barrier(context.Background()); err != nil {
			return err
		}
		peer := 1 - me
		ptr, err := s.DevicePtr(slab.Page{Slab: peer, Index: 2})
		if err != nil {
			return err
		}
		got := make([]byte, spec.PageSize)
		if err := dev.CopyDtoH(got, cuda.DevicePtr(ptr)); err != nil {
			return fmt.Errorf("copy from the pinned slab of rank %d: %w", peer, err)
		}
		if got[0] != byte(0xA0+peer) || got[len(got)-1] != byte(0xA0+peer) {
			return fmt.Errorf("pinned slab %d page 2 read through the device: %#x..%#x", peer, got[0], got[len(got)-1])
		}
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// roleCUDAIPC: every rank creates a device slab on device 0, fills its own slab's pages from
// the host, and reads every peer's slab through its IPC mapping.
func roleCUDAIPC(ctx context.Context, g *gloo.Group) error {
	c, err := Open(0)
	if err != nil {
		return err
	}
	defer c.Close()
	dev, err := c.Device(0)
	if err != nil {
		return err
	}
	spec := c.Spec(slab.Spec{Backend: slab.CUDAIPC, PageSize: 1 << 16, Pages: 8, Layout: "test", Device: 0})
	s, err := slab.OpenSet(ctx, g, spec)
	if err != nil {
		return err
	}
	defer s.Close()
	me := g.Rank()
	page := make([]byte, spec.PageSize)
	for idx := range spec.Pages {
		for i := range page {
			page[i] = pattern(me, idx, i)
		}
		ptr, err := s.DevicePtr(slab.Page{Slab: me, Index: idx})
		if err != nil {
			return err
		}
		if err := dev.CopyHtoD(cuda.DevicePtr(ptr), page); err != nil {
			return err
		}
	}
	if err := dev.Synchronize(); err != nil {
		return err
	}
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	for r := range s.Size() {
		for idx := range spec.Pages {
			ptr, err := s.DevicePtr(slab.Page{Slab: r, Index: idx})
			if err != nil {
				return err
			}
			if err := dev.CopyDtoH(page, cuda.DevicePtr(ptr)); err != nil {
				return fmt.Errorf("read slab %d page %d: %w", r, idx, err)
			}
			for i, v := range page {
				if v != pattern(r, idx, i) {
					return fmt.Errorf("slab %d page %d byte %d = %d, want %d", r, idx, i, v, pattern(r, idx, i))
				}
			}
		}
	}
	if _, err := s.Page(slab.Page{Slab: 0, Index: 0}); !errors.Is(err, slab.ErrUnsupported) {
		return fmt.Errorf("Page on a device set: %v", err)
	}
	return g.Barrier(ctx) // the exporters keep their memory until every importer is done
}

func TestMultiprocCUDAIPCSlabs(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	requireCUDA(t)
	multiproc.Run(t, multiproc.Spec{Role: "slab-cuda-ipc", N: 2, Timeout: 2 * time.Minute, Env: mpEnv(t, uniqueTag(t))})
}

// uniqueTag returns a segment tag unique to this test run.
func uniqueTag(t testing.TB) string {
	return fmt.Sprintf("t%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
}

// runMembers runs fn on every member of an n-rank in-process group and returns each
// member's error.
func runMembers(n int, fn func(g parallel.Group) error) []error {
	members := local.World(n, local.Options{Timeout: 10 * time.Second, Kind: "attn_cp"})
	return grouptest.Parallel(n, func(r int) error {
		defer members[r].Close()
		return fn(members[r])
	})
}

func hostSpec(tag string) slab.Spec {
	return slab.Spec{Backend: slab.Host, PageSize: 4096, Pages: 16, Layout: "kv bf16 L2 H4 D64", Tag: tag}
}

func mpEnv(t *testing.T, tag string) []string {
	return []string{"CPCACHE_STORE=file://" + t.TempDir(), "CPCACHE_TEST_TAG=" + tag}
}

// pattern is the byte written at offset i of page idx of slab r.
func pattern(r, idx, i int) byte { return byte(r*31 + idx*7 + i) }
