package stores_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cpcache/cpcache/internal/testenv/redistest"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/storagetest"
	"github.com/cpcache/cpcache/storage/stores"
)

// otherMACAlg is the payload MAC this CPU does not write by default.
func otherMACAlg() storage.MACAlg {
	if storage.PreferredMACAlg() == storage.MACGMAC {
		return storage.MACBlake3
	}
	return storage.MACGMAC
}

// TestConformanceOtherMAC runs the conformance suite of every backend with stores that
// write the payload MAC this CPU does not pick (the default runs cover the other): a
// tampered, forged or replayed value is a miss under either algorithm.
func TestConformanceOtherMAC(t *testing.T) {
	defer stores.SetMACAlg(otherMACAlg())()
	t.Run("file", TestDirConformance)
	t.Run("mem", TestMemConformance)
	t.Run("redis", func(t *testing.T) {
		r := redistest.Start(t)
		redisConformance(t, r, r.URL("conformance"))
	})
}

// TestReadsEitherMAC: values written under each payload MAC are read by stores that write
// the other one, on every backend (the algorithm is in each value's header): a store of
// BLAKE3 writers and a store of AES-GMAC writers share one directory or server.
func TestReadsEitherMAC(t *testing.T) {
	key := bytes.Repeat([]byte("e"), 32)
	urls := map[string]string{"file": "file://" + t.TempDir(), "mem": "mem://either-mac"}
	if r := redistest.Start(t); r != nil {
		urls["redis"] = r.URL("either")
	}
	for name, url := range urls {
		t.Run(name, func(t *testing.T) {
			ns := mustNamespace(t, "either-mac")
			open := func(alg storage.MACAlg) storage.Storage {
				defer stores.SetMACAlg(alg)()
				return openURL(t, url, storage.Options{Namespace: ns, MACKey: key})
			}
			b3, gm := open(storage.MACBlake3), open(storage.MACGMAC)
			defer b3.Close()
			defer gm.Close()
			keys := []storage.Key{storage.NewKey(ns, 1), storage.NewKey(ns, 2)}
			src := [][]byte{bytes.Repeat([]byte("b3"), 2048), bytes.Repeat([]byte("gm"), 2048)}
			if err := b3.Put(testCtx(t), keys[:1], src[:1]); err != nil {
				t.Fatal(err)
			}
			if err := gm.Put(testCtx(t), keys[1:], src[1:]); err != nil {
				t.Fatal(err)
			}
			for _, s := range []storage.Storage{b3, gm} {
				dst := [][]byte{make([]byte, 4096), make([]byte, 4096)}
				if n, err := s.Get(testCtx(t), keys, dst, nil); n != 2 || err != nil {
					t.Fatalf("get: %d of 2, %v", n, err)
				}
				for i := range dst {
					if !bytes.Equal(dst[i], src[i]) {
						t.Errorf("page %d read back differs", i)
					}
				}
			}
		})
	}
}

// TestDirGetFused is a table of the directory backend's Get paths — straight into place
// (RWF_NOWAIT from the page cache: a file of the current format's size) and through a
// private buffer (a page not cached, or a file of another size) — under each payload MAC
// and page size, each against every way a stored file goes bad: only genuine values are
// hits, with the right bytes; every bad one is a miss, counted corrupt (forged where its
// checksums hold), and leaves its key to be purged.
func TestDirGetFused(t *testing.T) {
	muts := []fileMutation{
		{"payload bit", false, func(r *rand.Rand, v, _ []byte) []byte {
			v[storage.HeaderSize+r.IntN(len(v)-storage.HeaderSize)] ^= 1 << r.IntN(8)
			return v
		}},
		{"header bit", false, func(r *rand.Rand, v, _ []byte) []byte {
			v[r.IntN(storage.HeaderSize)] ^= 1 << r.IntN(8)
			return v
		}},
		{"payload replaced, resealed", true, func(r *rand.Rand, v, _ []byte) []byte {
			v[storage.HeaderSize+r.IntN(len(v)-storage.HeaderSize)] ^= 0x80
			return storagetest.Reseal(v)
		}},
		{"another key's value", true, func(_ *rand.Rand, _, other []byte) []byte { return other }},
		{"truncated", false, func(_ *rand.Rand, v, _ []byte) []byte { return v[:len(v)-1] }},
		{"extended", false, func(_ *rand.Rand, v, _ []byte) []byte { return append(v, 0) }},
	}
	for _, alg := range []storage.MACAlg{storage.MACBlake3, storage.MACGMAC} {
		for _, inPlace := range []bool{true, false} {
			for _, size := range []int{1, 4097, 64<<10 + 3, 1 << 20} {
				t.Run(fmt.Sprintf("%v/inplace=%v/%d", alg, inPlace, size), func(t *testing.T) {
					undo := stores.SetMACAlg(alg)
					s := openURL(t, "file://"+t.TempDir(), storage.Options{Namespace: mustNamespace(t, "fused")})
					undo()
					defer s.Close()
					testDirGetFused(t, s, inPlace, size, muts)
				})
			}
		}
	}
}

// fileMutation is a way a stored file goes bad (forged: its checksums still hold).
type fileMutation struct {
	name   string
	forged bool
	mutate func(r *rand.Rand, v, other []byte) []byte
}

func testDirGetFused(t *testing.T, s storage.Storage, inPlace bool, size int, muts []fileMutation) {
	r := rand.New(rand.NewPCG(uint64(size), 7))
	ns := mustNamespace(t, "fused")
	n := len(muts) + 1
	keys := make([]storage.Key, n)
	src := make([][]byte, n)
	for i := range keys {
		keys[i] = storage.NewKey(ns, uint64(i))
		src[i] = make([]byte, size)
		for j := range src[i] {
			src[i][j] = byte(r.Uint32())
		}
	}
	if err := s.Put(testCtx(t), keys, src); err != nil {
		t.Fatal(err)
	}
	genuine0, err := os.ReadFile(stores.DirPath(s, keys[0]))
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range muts {
		name := stores.DirPath(s, keys[i+1])
		v, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, m.mutate(r, v, bytes.Clone(genuine0)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stores.DirNoWait(s, inPlace)
	if !inPlace {
		// Not cached: the kernel drops clean pages (written back first).
		for _, k := range keys {
			fd, err := unix.Open(stores.DirPath(s, k), unix.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			unix.Fdatasync(fd)
			unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
			unix.Close(fd)
		}
	}
	before := s.Stats()
	dst := make([][]byte, n)
	for i := range dst {
		dst[i] = make([]byte, size)
	}
	found := make([]bool, n)
	if _, err := s.Get(testCtx(t), keys, dst, found); err != nil {
		t.Fatal(err)
	}
	reads, noWait := stores.DirInPlaceReads(s)
	if inPlace && !noWait {
		t.Skip("the file system refuses RWF_NOWAIT reads: Get reads every page through a private buffer (the other subtests)")
	}
	if !found[0] || !bytes.Equal(dst[0], src[0]) {
		t.Fatalf("genuine page: found %v, bytes equal %v", found[0], bytes.Equal(dst[0], src[0]))
	}
	forged := 0
	for i, m := range muts {
		if found[i+1] {
			t.Errorf("%s: a hit", m.name)
		}
		if m.forged {
			forged++
		}
	}
	st := s.Stats()
	if d := st.Corrupt - before.Corrupt; d != uint64(len(muts)) {
		t.Errorf("Corrupt +%d, want %d", d, len(muts))
	}
	if d := st.Forged - before.Forged; d != uint64(forged) {
		t.Errorf("Forged +%d, want %d", d, forged)
	}
	// Straight into place: every file of the current size that the page cache held (the
	// genuine page and the 4 same-size mutations); through the private buffer: none.
	if want := map[bool]uint64{true: 5, false: 0}[inPlace]; reads != want {
		t.Errorf("%d pages read in place, want %d", reads, want)
	}
}
