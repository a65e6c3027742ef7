package slab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/parallel/grouptest"
	"github.com/cpcache/cpcache/parallel/local"
)

// runMembers runs fn on every member of a new in-process group of n ranks, concurrently, and
// returns each member's error.
func runMembers(n int, fn func(g parallel.Group) error) []error {
	members := local.World(n, local.Options{Timeout: 10 * time.Second, Kind: "attn_cp"})
	return grouptest.Parallel(n, func(r int) error {
		defer members[r].Close()
		return fn(members[r])
	})
}

// uniqueTag returns a segment tag unique to this test run.
func uniqueTag(t testing.TB) string {
	return fmt.Sprintf("t%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
}

// leftovers lists what of the segments with tag is still around: a name in /dev/shm (there
// must never be one) or a memfd this process still holds open (its own slab still offered).
func leftovers(tag string) []string {
	m, _ := filepath.Glob(filepath.Join("/dev/shm", SegmentPrefix+tag+"-*"))
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, "/memfd:"+SegmentPrefix+tag+"-") {
			m = append(m, l)
		}
	}
	return m
}

func hostSpec(tag string) Spec {
	return Spec{Backend: Host, PageSize: 4096, Pages: 16, Layout: "kv bf16 L2 H4 D64", Tag: tag}
}

// pattern is the byte written at offset i of page idx of slab r.
func pattern(r, idx, i int) byte { return byte(r*31 + idx*7 + i) }

// writeOwnReadAll writes a pattern into every page of this rank's slab, waits for every rank,
// then checks every page of every slab.
func writeOwnReadAll(ctx context.Context, s *Set) error {
	g := s.Group()
	me := g.Rank()
	buf := make([]byte, s.PageSize())
	for idx := range s.PagesPerSlab() {
		for i := range buf {
			buf[i] = pattern(me, idx, i)
		}
		if err := s.WritePage(Page{Slab: me, Index: idx}, buf); err != nil {
			return err
		}
	}
	if err := g.Barrier(ctx); err != nil {
		return err
	}
	for r := range s.Size() {
		for idx := range s.PagesPerSlab() {
			b, err := s.Page(Page{Slab: r, Index: idx})
			if err != nil {
				return err
			}
			for i, v := range b {
				if v != pattern(r, idx, i) {
					return fmt.Errorf("rank %d: slab %d page %d byte %d = %d, want %d", me, r, idx, i, v, pattern(r, idx, i))
				}
			}
		}
	}
	return g.Barrier(ctx) // nobody closes while a peer still reads
}

func TestOpenSetMapsEveryRanksSlabAndLeavesNoSegment(t *testing.T) {
	tag := uniqueTag(t)
	ctx := context.Background()
	errs := runMembers(4, func(g parallel.Group) error {
		s, err := OpenSet(ctx, g, hostSpec(tag))
		if err != nil {
			return err
		}
		defer s.Close()
		// The ranks share this process: look once every one of them has returned.
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		if left := leftovers(tag); len(left) != 0 {
			return fmt.Errorf("segments still offered after OpenSet: %v", left)
		}
		if s.Group() != g || fmt.Sprint(s.Ranks()) != "[0 1 2 3]" || s.Rank() != g.Rank() || s.Size() != 4 {
			return fmt.Errorf("set identity: group %v ranks %v rank %d size %d", s.Group().Name(), s.Ranks(), s.Rank(), s.Size())
		}
		if err := writeOwnReadAll(ctx, s); err != nil {
			return err
		}
		if err := s.Close(); err != nil {
			return err
		}
		if err := s.Close(); err != nil {
			return fmt.Errorf("second close: %w", err)
		}
		if _, err := s.Page(Page{Slab: 0, Index: 0}); !errors.Is(err, ErrClosed) {
			return fmt.Errorf("page after close: %v, want ErrClosed", err)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if left := leftovers(tag); len(left) != 0 {
		t.Fatalf("segments left: %v", left)
	}
	var nilSet *Set
	if err := nilSet.Close(); err != nil {
		t.Fatal(err)
	}
}

// allFailAlike runs OpenSet with per-rank specs and checks every rank failed with the same
// error, wrapping want and containing every fragment.
func allFailAlike(t *testing.T, n int, spec func(rank int) Spec, want error, fragments ...string) {
	t.Helper()
	tag := spec(0).Tag
	errs := runMembers(n, func(g parallel.Group) error {
		s, err := OpenSet(context.Background(), g, spec(g.Rank()))
		if err == nil {
			s.Close()
			return errors.New("OpenSet succeeded")
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, want) {
			t.Fatalf("rank %d: %v, want %v", r, err, want)
		}
		if err.Error() != errs[0].Error() {
			t.Fatalf("rank %d error differs from rank 0's:\n%v\n%v", r, err, errs[0])
		}
	}
	for _, f := range fragments {
		if !strings.Contains(errs[0].Error(), f) {
			t.Fatalf("error %q does not mention %q", errs[0], f)
		}
	}
	if left := leftovers(tag); len(left) != 0 {
		t.Fatalf("segments left: %v", left)
	}
}

func TestMismatchedSpecFailsEveryRankNamingTheRank(t *testing.T) {
	tag := uniqueTag(t)
	cases := []struct {
		name      string
		odd       func(*Spec)
		fragments []string
	}{
		{"page size", func(s *Spec) { s.PageSize = 8192 }, []string{"rank 2 (global 2)", "page size 8192 (majority 4096)"}},
		{"pages", func(s *Spec) { s.Pages = 17 }, []string{"rank 2", "pages 17 (majority 16)"}},
		{"layout", func(s *Spec) { s.Layout = "kv fp8" }, []string{"rank 2", `layout "kv fp8"`}},
		{"backend", func(s *Spec) { s.Backend = CUDAIPC }, []string{"rank 2", `backend "cuda-ipc" (majority "host")`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			allFailAlike(t, 4, func(r int) Spec {
				s := hostSpec(tag)
				if r == 2 {
					c.odd(&s)
				}
				return s
			}, ErrSpecMismatch, append(c.fragments, "group attn_cp[0..3]")...)
		})
	}
}

func TestInvalidSpecOnOneRankFailsEveryRank(t *testing.T) {
	tag := uniqueTag(t)
	allFailAlike(t, 3, func(r int) Spec {
		s := hostSpec(tag)
		if r == 1 {
			s.Tag = "bad/tag"
		}
		return s
	}, ErrSetup, "rank 1 (global 1) could not create its slab", `tag "bad/tag"`)
}

// A CUDAIPC spec without a DeviceBackend (no driver in this process) fails every rank,
// naming the setting.
func TestDeviceBackendWithoutDriverFailsEveryRankCleanly(t *testing.T) {
	allFailAlike(t, 2, func(int) Spec {
		return Spec{Backend: CUDAIPC, PageSize: 4096, Pages: 4, Tag: uniqueTag(t)}
	}, ErrSetup, "rank 0", "rank 1", "needs a CUDA driver", "Spec.DeviceBackend is nil")
}

// PinHost without a Pinner is an error on every rank, naming both settings: the slabs are
// never silently left unpinned.
func TestPinHostWithoutPinnerFailsEveryRank(t *testing.T) {
	tag := uniqueTag(t)
	allFailAlike(t, 2, func(int) Spec {
		s := hostSpec(tag)
		s.PinHost = true
		return s
	}, ErrSetup, "rank 0", "rank 1", "Spec.PinHost is set but Spec.Pinner is nil")
}

func TestRankCrashingDuringSetupLeavesNoSegment(t *testing.T) {
	tag := uniqueTag(t)
	const crasher = 1
	testHookAfterExchange = func(rank int) error {
		if rank == crasher {
			return errors.New("simulated crash")
		}
		return nil
	}
	defer func() { testHookAfterExchange = nil }()
	errs := runMembers(4, func(g parallel.Group) error {
		s, err := OpenSet(context.Background(), g, hostSpec(tag))
		if err == nil {
			s.Close()
			return errors.New("OpenSet succeeded")
		}
		return err
	})
	for r, err := range errs {
		want := error(parallel.ErrPeerLost)
		if r == crasher {
			want = nil
		}
		if want != nil && !errors.Is(err, want) {
			t.Errorf("rank %d: %v, want ErrPeerLost", r, err)
		}
	}
	// Only the crashed rank's own segment is still held, by the goroutine that would have
	// died with its process: the kernel frees it then.
	if left := leftovers(tag); len(left) != 1 || !strings.Contains(left[0], fmt.Sprintf("-r%d", crasher)) {
		t.Fatalf("segments left after a crash during setup: %v, want only rank %d's, held by its 'process'", left, crasher)
	}
}

func TestPageAccessIsBoundsChecked(t *testing.T) {
	tag := uniqueTag(t)
	errs := runMembers(2, func(g parallel.Group) error {
		s, err := OpenSet(context.Background(), g, hostSpec(tag))
		if err != nil {
			return err
		}
		defer s.Close()
		for _, p := range []Page{{Slab: -1, Index: 0}, {Slab: 2, Index: 0}, {Slab: 0, Index: -1}, {Slab: 0, Index: 16}} {
			if _, err := s.Page(p); !errors.Is(err, ErrBadArgument) || !strings.Contains(err.Error(), p.String()) {
				return fmt.Errorf("Page(%v): %v", p, err)
			}
			if err := s.WritePage(p, nil); !errors.Is(err, ErrBadArgument) {
				return fmt.Errorf("WritePage(%v): %v", p, err)
			}
			if _, err := s.ReadPage(p, nil); !errors.Is(err, ErrBadArgument) {
				return fmt.Errorf("ReadPage(%v): %v", p, err)
			}
		}
		if err := s.WritePage(Page{Slab: 0, Index: 0}, make([]byte, 4097)); !errors.Is(err, ErrBadArgument) || !strings.Contains(err.Error(), "4097") {
			return fmt.Errorf("oversize write: %v", err)
		}
		b, err := s.Page(Page{Slab: 1, Index: 15})
		if err != nil || len(b) != 4096 || cap(b) != 4096 {
			return fmt.Errorf("last page: len %d cap %d err %v", len(b), cap(b), err)
		}
		if _, err := s.DevicePtr(Page{Slab: 0, Index: 0}); !errors.Is(err, ErrUnsupported) {
			return fmt.Errorf("DevicePtr on host: %v", err)
		}
		if _, err := s.Slab(2); !errors.Is(err, ErrBadArgument) {
			return fmt.Errorf("Slab(2): %v", err)
		}
		// SlabMemory is the whole slab, and its page p is Page's bytes.
		whole, err := s.SlabMemory(1)
		if err != nil || len(whole) != 16*4096 || cap(whole) != 16*4096 || &whole[15*4096] != &b[0] {
			return fmt.Errorf("SlabMemory(1): len %d err %v, or not the memory Page hands out", len(whole), err)
		}
		if _, err := s.SlabMemory(2); !errors.Is(err, ErrBadArgument) {
			return fmt.Errorf("SlabMemory(2): %v", err)
		}
		if err := g.Barrier(context.Background()); err != nil {
			return err
		}
		// ReadPage sees what the peer wrote through WritePage.
		me, peer := g.Rank(), 1-g.Rank()
		if err := s.WritePage(Page{Slab: me, Index: 3}, []byte{byte(me + 1), 9, 9}); err != nil {
			return err
		}
		if err := g.Barrier(context.Background()); err != nil {
			return err
		}
		got := make([]byte, 3)
		if n, err := s.ReadPage(Page{Slab: peer, Index: 3}, got); err != nil || n != 3 || !bytes.Equal(got, []byte{byte(peer + 1), 9, 9}) {
			return fmt.Errorf("ReadPage of peer: %v %d %v", got, n, err)
		}
		return g.Barrier(context.Background())
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestOpenSharedSet: in a group of 8 where group ranks 0 and 4 make the slabs, every member
// maps both; a page the maker of slab 1 writes is read by every member, and nothing is left.
func TestOpenSharedSet(t *testing.T) {
	tag := uniqueTag(t)
	errs := runMembers(8, func(g parallel.Group) error {
		ctx := context.Background()
		s, err := OpenSharedSet(ctx, g, hostSpec(tag), []int{0, 4})
		if err != nil {
			return err
		}
		defer s.Close()
		me := g.Rank()
		wantOwn := map[int]int{0: 0, 4: 1}[me]
		if _, maker := map[int]int{0: 0, 4: 1}[me]; !maker {
			wantOwn = -1
		}
		if s.Size() != 2 || s.Rank() != wantOwn || !s.Shared() || fmt.Sprint(s.Ranks()) != "[0 4]" {
			return fmt.Errorf("rank %d: size %d, own slab %d (want %d), shared %t, ranks %v", me, s.Size(), s.Rank(), wantOwn, s.Shared(), s.Ranks())
		}
		if me == 4 {
			if err := s.WritePage(Page{Slab: 1, Index: 3}, []byte("shared page")); err != nil {
				return err
			}
		}
		if err := g.Barrier(ctx); err != nil {
			return err
		}
		b, err := s.Page(Page{Slab: 1, Index: 3})
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(b, []byte("shared page")) {
			return fmt.Errorf("rank %d reads %q from slab 1 page 3", me, b[:11])
		}
		return g.Barrier(ctx)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if l := leftovers(tag); len(l) > 0 {
		t.Errorf("left over: %v", l)
	}
}

// TestOpenSharedSetBadMakers: makers out of order or out of the group are ErrBadArgument
// naming the maker, before any collective.
func TestOpenSharedSetBadMakers(t *testing.T) {
	g := local.World(1, local.Options{Timeout: time.Second})[0]
	defer g.Close()
	for _, makers := range [][]int{nil, {1}, {0, 0}} {
		_, err := OpenSharedSet(context.Background(), g, hostSpec(uniqueTag(t)), makers)
		if !errors.Is(err, ErrBadArgument) {
			t.Errorf("makers %v: %v, want ErrBadArgument", makers, err)
		}
	}
}
