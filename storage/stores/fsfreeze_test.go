package stores_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
)

// EnvFsfreezeTest runs TestDirFsfreeze, which needs root: it loop-mounts an ext4 image and
// freezes it with fsfreeze(8).
const EnvFsfreezeTest = "CPCACHE_TEST_FSFREEZE"

// TestDirFsfreeze is TestDirFrozenFileSystem on a real frozen file system: an ext4 image,
// loop-mounted and frozen with fsfreeze -f, where a write blocks in the kernel
// (uninterruptibly: not even SIGKILL ends it) until fsfreeze -u. A Put returns at its
// deadline with ErrUnavailable, its write abandoned and counted as stuck; after the thaw
// the write finishes and the store works.
func TestDirFsfreeze(t *testing.T) {
	if os.Getenv(EnvFsfreezeTest) == "" {
		t.Skipf("mounts and freezes a loop ext4 file system (root, mkfs.ext4, mount, fsfreeze): set %s=1 to run it", EnvFsfreezeTest)
	}
	if os.Geteuid() != 0 {
		t.Skip("fsfreeze and loop mounts need root")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount", "fsfreeze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: %v", tool, err)
		}
	}
	run := func(name string, args ...string) error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Logf("%s %v: %v\n%s", name, args, err, out)
		}
		return err
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 32<<20); err != nil {
		t.Fatal(err)
	}
	if run("mkfs.ext4", "-q", "-F", img) != nil || run("mount", "-o", "loop", img, mnt) != nil {
		t.Skip("cannot make or loop-mount an ext4 image here (see the log)")
	}
	t.Cleanup(func() {
		_ = exec.Command("fsfreeze", "-u", mnt).Run() // a failed test must not leave it frozen
		_ = run("umount", mnt)
	})

	ns := mustNamespace(t, "fsfreeze-test")
	st := openURL(t, "file://"+mnt, storage.Options{Namespace: ns})
	defer st.Close()
	ctx := testCtx(t)
	page := bytes.Repeat([]byte{0x42}, 4096)
	keys := []storage.Key{storage.NewKeyBytes(ns, []byte("before"))}
	if err := st.Put(ctx, keys, [][]byte{page}); err != nil {
		t.Fatal(err)
	}
	if err := run("fsfreeze", "-f", mnt); err != nil {
		t.Skip("fsfreeze -f failed here (see the log)")
	}
	frozen := []storage.Key{storage.NewKeyBytes(ns, []byte("frozen"))}
	returnsWithin(t, "put", 200*time.Millisecond, func(ctx context.Context) error { return st.Put(ctx, frozen, [][]byte{page}) })
	if s := st.Stats(); s.Abandoned != 1 || s.Stuck != 1 {
		t.Fatalf("stats %+v on the frozen file system: want the write abandoned and stuck", s)
	}
	if err := run("fsfreeze", "-u", mnt); err != nil {
		t.Fatal("fsfreeze -u failed")
	}
	waitUnstuck(t, st)
	if err := st.Put(ctx, keys, [][]byte{page}); err != nil {
		t.Fatalf("put after the thaw: %v", err)
	}
	if n, err := st.Exists(ctx, append(keys, frozen...), nil); n != 2 || err != nil {
		t.Fatalf("after the thaw: %d of 2 pages stored (the abandoned put finishes), %v", n, err)
	}
}
