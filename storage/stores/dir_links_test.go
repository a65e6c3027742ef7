package stores_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// The directory store is shared with whoever can write its directory (issue 23's adversary):
// such a user can delete pages, never make the store read, write or remove anything outside
// it. These tests plant symbolic links where the store keeps its namespace, fan-out, trash
// and page entries, and check that no operation follows them.

// victimDir makes a directory outside the store holding a file and a subdirectory with a
// file, and returns it with a check that all of it is still there, unchanged.
func victimDir(t *testing.T) (string, func(what string)) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "victim")
	files := map[string]string{"precious.txt": "keep me", filepath.Join("ab", "deep.txt"): "keep me too"}
	for name, body := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir, func(what string) {
		t.Helper()
		for name, body := range files {
			if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(b) != body {
				t.Errorf("%s: the victim's %s: %q, %v; want it untouched", what, name, b, err)
			}
		}
		ents, _ := os.ReadDir(dir)
		if len(ents) != 2 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s: the victim directory holds %v; want only precious.txt and ab", what, names)
		}
	}
}

// linkModes runs fn once with openat2 and once opening path components one at a time (the
// fallback for kernels or sandboxes without openat2).
func linkModes(t *testing.T, fn func(t *testing.T)) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "component walk"
		}
		t.Run(name, func(t *testing.T) {
			defer stores.ForceComponentWalk(walk)()
			probe := openURL(t, "file://"+t.TempDir(), storage.Options{Namespace: mustNamespace(t, "probe")})
			if got := stores.DirWalks(probe); got != walk {
				t.Logf("this kernel has no openat2: both runs walk components")
			}
			probe.Close()
			fn(t)
		})
	}
}

// warnings collects what a storage reports to Options.OnWarning.
type warnings struct {
	mu   sync.Mutex
	errs []error
}

func (w *warnings) add(err error) { w.mu.Lock(); w.errs = append(w.errs, err); w.mu.Unlock() }

func (w *warnings) text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	for _, e := range w.errs {
		b.WriteString(e.Error() + "\n")
	}
	return b.String()
}

func (w *warnings) links() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range w.errs {
		if errors.Is(e, storage.ErrLink) {
			n++
		}
	}
	return n
}

func symlink(t *testing.T, target, name string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

// fanOutKeys returns n keys of ns whose pages share one fan-out directory, and its name.
func fanOutKeys(t *testing.T, s storage.Storage, ns storage.Namespace, n int) ([]storage.Key, string) {
	var keys []storage.Key
	var fan string
	for h := uint64(0); len(keys) < n; h++ {
		k := storage.NewKey(ns, h)
		d := filepath.Dir(stores.DirPath(s, k))
		if fan == "" {
			fan = d
		}
		if d == fan {
			keys = append(keys, k)
		}
	}
	return keys, fan
}

// TestDirClearDoesNotFollowLinks: a namespace directory that is a link, a trash entry whose
// "ns" is a link, a trash entry that is itself a link and a fan-out directory that is a link
// are removed as links by Clear (and reported): the directories they point to keep every
// file (a Clear that followed them would empty the victim).
func TestDirClearDoesNotFollowLinks(t *testing.T) {
	linkModes(t, func(t *testing.T) {
		dir := t.TempDir()
		ns := mustNamespace(t, "clear-links")
		var w warnings
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns, OnWarning: w.add})
		defer s.Close()
		nsDir := filepath.Join(dir, ns.String())

		// The namespace directory is a link.
		victim, intact := victimDir(t)
		if err := os.RemoveAll(nsDir); err != nil {
			t.Fatal(err)
		}
		symlink(t, victim, nsDir)
		if err := s.Clear(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		intact("clear of a linked namespace directory")
		if fi, err := os.Lstat(nsDir); err != nil || !fi.IsDir() {
			t.Errorf("after clear, the namespace directory: %v, %v; want a real directory", fi, err)
		}

		// Trash left by a "crashed Clear" whose ns is a link, and a trash entry that is a link
		// to a directory holding an ns.
		victim2, intact2 := victimDir(t)
		symlink(t, victim2, filepath.Join(dir, ".trash-"+ns.String()+"-1", "ns"))
		victim3, _ := victimDir(t)
		if err := os.Mkdir(filepath.Join(victim3, "ns"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(victim3, "ns", "x"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		symlink(t, victim3, filepath.Join(dir, ".trash-"+ns.String()+"-2"))
		// A fan-out directory that is a link.
		victim4, intact4 := victimDir(t)
		symlink(t, victim4, filepath.Join(nsDir, "ab"))
		before := s.Stats().Links
		if err := s.Clear(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		intact2("clear of a trash entry whose ns is a link")
		if _, err := os.Stat(filepath.Join(victim3, "ns", "x")); err != nil {
			t.Errorf("clear of a trash entry that is a link: the victim's ns/x: %v", err)
		}
		ents, _ := os.ReadDir(victim3)
		if len(ents) != 3 {
			t.Errorf("clear of a trash entry that is a link: the victim holds %d entries, want 3", len(ents))
		}
		intact4("clear of a namespace with a linked fan-out directory")
		left, _ := filepath.Glob(filepath.Join(dir, ".trash-*"))
		if len(left) != 0 {
			t.Errorf("trash left after clear: %v", left)
		}
		if got := s.Stats().Links - before; got != 3 {
			t.Errorf("links counted by clear: %d, want 3 (trash ns, trash entry, fan-out); warnings:\n%s", got, w.text())
		}
		if w.links() == 0 || !strings.Contains(w.text(), victim4) && !strings.Contains(w.text(), ".trash-") {
			t.Errorf("no link reported with its path; warnings:\n%s", w.text())
		}
	})
}

// TestDirPutDoesNotWriteThroughLinks: a backup into a fan-out directory, or a namespace
// directory, that is a link writes nothing where the link points; the skipped pages are
// counted in Stats.Links and read back as misses.
func TestDirPutDoesNotWriteThroughLinks(t *testing.T) {
	linkModes(t, func(t *testing.T) {
		dir := t.TempDir()
		ns := mustNamespace(t, "put-links")
		var w warnings
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns, OnWarning: w.add})
		defer s.Close()
		keys, fan := fanOutKeys(t, s, ns, 3)
		pages := [][]byte{[]byte("page-0"), []byte("page-1"), []byte("page-2")}

		victim, intact := victimDir(t)
		symlink(t, victim, fan)
		if err := s.Put(testCtx(t), keys, pages); err != nil {
			t.Fatalf("put into a linked fan-out directory: %v", err)
		}
		intact("put into a linked fan-out directory")
		if st := s.Stats(); st.Links != 3 || st.Puts != 0 {
			t.Errorf("put into a linked fan-out directory: %d links, %d puts counted; want 3, 0", st.Links, st.Puts)
		}
		dst := [][]byte{make([]byte, 6), make([]byte, 6), make([]byte, 6)}
		if n, err := s.Get(testCtx(t), keys, dst, nil); n != 0 || err != nil {
			t.Errorf("get through a linked fan-out directory: %d, %v; want a miss", n, err)
		}
		if n, err := s.Exists(testCtx(t), keys, make([]bool, 3)); n != 0 || err != nil {
			t.Errorf("exists through a linked fan-out directory: %d, %v; want a miss", n, err)
		}
		if err := s.Delete(testCtx(t), keys); err != nil {
			t.Errorf("delete through a linked fan-out directory: %v", err)
		}
		intact("get, exists and delete through a linked fan-out directory")

		// The whole namespace directory is a link.
		victim2, intact2 := victimDir(t)
		nsDir := filepath.Join(dir, ns.String())
		if err := os.RemoveAll(nsDir); err != nil {
			t.Fatal(err)
		}
		symlink(t, victim2, nsDir)
		if err := s.Put(testCtx(t), keys, pages); err != nil {
			t.Fatalf("put into a linked namespace directory: %v", err)
		}
		if n, err := s.Get(testCtx(t), keys, dst, nil); n != 0 || err != nil {
			t.Errorf("get through a linked namespace directory: %d, %v; want a miss", n, err)
		}
		intact2("put and get through a linked namespace directory")
		if w.links() == 0 || !strings.Contains(w.text(), fan) || !strings.Contains(w.text(), nsDir) {
			t.Errorf("the links are not reported with their paths; warnings:\n%s", w.text())
		}
	})
}

// TestDirPurgeDeletesNothingOutside: a file outside the store, reached through a linked
// fan-out directory under a page's name, is neither read nor purged (read through the link,
// it would be found corrupt and deleted).
func TestDirPurgeDeletesNothingOutside(t *testing.T) {
	linkModes(t, func(t *testing.T) {
		dir := t.TempDir()
		ns := mustNamespace(t, "purge-links")
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns, OnWarning: func(error) {}})
		defer s.Close()
		keys, fan := fanOutKeys(t, s, ns, 1)
		victim := t.TempDir()
		target := filepath.Join(victim, filepath.Base(stores.DirPath(s, keys[0])))
		if err := os.WriteFile(target, []byte("not a page, but mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		symlink(t, victim, fan)
		for _, op := range []string{"get", "exists", "exists with present"} {
			n, err := lookup(t, s, op, keys[0], 8)
			if n != 0 || err != nil {
				t.Errorf("%s: %d, %v; want a miss", op, n, err)
			}
			if b, err := os.ReadFile(target); err != nil || string(b) != "not a page, but mine" {
				t.Errorf("%s: the file outside the store: %q, %v; want it untouched", op, b, err)
			}
		}
		if st := s.Stats(); st.Purged != 0 || st.Corrupt != 0 {
			t.Errorf("purged %d, corrupt %d: the file outside the store was taken for a page", st.Purged, st.Corrupt)
		}
	})
}

// TestDirPageLinkIsNotFollowed: a page file that is a link to a file outside the store
// (here a genuine copy of the page) is never read: Get and Exists miss, count it corrupt and
// a link, and the purge removes the link, not its target, which stays unchanged.
func TestDirPageLinkIsNotFollowed(t *testing.T) {
	linkModes(t, func(t *testing.T) {
		dir := t.TempDir()
		ns := mustNamespace(t, "page-links")
		var w warnings
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns, OnWarning: w.add})
		defer s.Close()
		k := storage.NewKey(ns, 42)
		page := bytes.Repeat([]byte{7}, 64)
		for _, op := range []string{"get", "exists", "exists with present"} {
			if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{page}); err != nil {
				t.Fatal(err)
			}
			name := stores.DirPath(s, k)
			genuine, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(t.TempDir(), "outside")
			if err := os.WriteFile(target, genuine, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(name); err != nil {
				t.Fatal(err)
			}
			symlink(t, target, name)
			before := s.Stats()
			n, err := lookup(t, s, op, k, len(page))
			if n != 0 || err != nil {
				t.Errorf("%s of a linked page: %d, %v; want a miss", op, n, err)
			}
			st := s.Stats()
			if st.Links != before.Links+1 || st.Corrupt != before.Corrupt+1 || st.Purged != before.Purged+1 {
				t.Errorf("%s of a linked page: links +%d, corrupt +%d, purged +%d; want +1 each", op,
					st.Links-before.Links, st.Corrupt-before.Corrupt, st.Purged-before.Purged)
			}
			if b, err := os.ReadFile(target); err != nil || !bytes.Equal(b, genuine) {
				t.Errorf("%s: the link's target changed or went: %v", op, err)
			}
			if _, err := os.Lstat(name); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: the link is still there (%v)", op, err)
			}
		}
		// A backup over a linked page replaces the link (rename never follows it), not its target.
		target := filepath.Join(t.TempDir(), "outside")
		if err := os.WriteFile(target, []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
		symlink(t, target, stores.DirPath(s, k))
		if err := s.Put(testCtx(t), []storage.Key{k}, [][]byte{page}); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(target); string(b) != "mine" {
			t.Errorf("put over a linked page wrote its target: %q", b)
		}
		if n, err := s.Get(testCtx(t), []storage.Key{k}, [][]byte{make([]byte, len(page))}, nil); n != 1 || err != nil {
			t.Errorf("get after a put over a linked page: %d, %v", n, err)
		}
	})
}

// TestDirKeyFileLinkRefused: a store whose own key file is a link is refused at open (the
// link's target could be a file whose contents the link's maker knows), naming the file.
func TestDirKeyFileLinkRefused(t *testing.T) {
	t.Setenv(stores.EnvKeyFile, "")
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "key")
	if _, err := stores.LoadOrCreateKeyFile(target); err != nil {
		t.Fatal(err)
	}
	symlink(t, target, filepath.Join(dir, stores.DirKeyFile))
	_, err := stores.Open(testCtx(t), "file://"+dir, storage.Options{Namespace: mustNamespace(t, "key-link")})
	if !errors.Is(err, storage.ErrBadArgument) || !strings.Contains(err.Error(), filepath.Join(dir, stores.DirKeyFile)) {
		t.Errorf("open with a linked key file: %v; want ErrBadArgument naming it", err)
	}
}

// TestDirWarnsOnWritableDirectory: a store directory that group or others can write is
// reported once at open, naming it and its mode (sticky or not: see dirStore); a private one
// is not.
func TestDirWarnsOnWritableDirectory(t *testing.T) {
	for _, mode := range []os.FileMode{0o700, 0o750, 0o770, 0o777, 0o777 | os.ModeSticky} {
		dir := filepath.Join(t.TempDir(), "store")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		var w warnings
		s := openURL(t, "file://"+dir, storage.Options{Namespace: mustNamespace(t, "mode"), OnWarning: w.add})
		s.Close()
		got := w.text()
		if mode.Perm()&0o022 == 0 {
			if got != "" {
				t.Errorf("mode %v: warned: %s", mode, got)
			}
			continue
		}
		if len(w.errs) != 1 || !errors.Is(w.errs[0], storage.ErrWritableStore) || !strings.Contains(got, dir) ||
			!strings.Contains(got, os.FileMode(os.ModeDir|mode).String()) {
			t.Errorf("mode %v: warnings %q; want one ErrWritableStore naming %s and its mode", mode, got, dir)
		}
	}
}

// TestDirReapsStaleTemporaryFiles: temporary files of a writer that died mid-Put (older than
// stores.TempMaxAge) are removed by the next Put into their fan-out directory; one a live
// writer may still be writing (younger) is kept, and so is every page.
func TestDirReapsStaleTemporaryFiles(t *testing.T) {
	linkModes(t, func(t *testing.T) {
		dir := t.TempDir()
		ns := mustNamespace(t, "reap")
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
		keys, fan := fanOutKeys(t, s, ns, 2)
		if err := s.Put(testCtx(t), keys[:1], [][]byte{[]byte("one")}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		stale, fresh := filepath.Join(fan, ".tmp-crashed1"), filepath.Join(fan, ".tmp-writing")
		for _, name := range []string{stale, fresh} {
			if err := os.WriteFile(name, []byte("partial"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		old := time.Now().Add(-stores.TempMaxAge - time.Minute)
		if err := os.Chtimes(stale, old, old); err != nil {
			t.Fatal(err)
		}
		s = openURL(t, "file://"+dir, storage.Options{Namespace: ns})
		defer s.Close()
		if err := s.Put(testCtx(t), keys[1:], [][]byte{[]byte("two")}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a crashed writer's temporary file is still there: %v", err)
		}
		if _, err := os.Lstat(fresh); err != nil {
			t.Errorf("a live writer's temporary file was removed: %v", err)
		}
		if n, err := s.Exists(testCtx(t), keys, nil); n != 2 || err != nil {
			t.Errorf("pages beside the reaped file: %d, %v", n, err)
		}
		ents, _ := os.ReadDir(fan)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if len(names) != 3 || !slices.Contains(names, ".tmp-writing") {
			t.Errorf("fan-out directory holds %v; want the two pages and .tmp-writing", names)
		}
	})
}

// TestDirLinkWarningsNameTheCall: a link reported by put, delete or clear names that call,
// and says what was done with it: put and delete skip it (not followed), clear removes it
// (the link itself, never its target).
func TestDirLinkWarningsNameTheCall(t *testing.T) {
	linkModes(t, func(t *testing.T) {
		dir := t.TempDir()
		ns := mustNamespace(t, "link-ops")
		var w warnings
		s := openURL(t, "file://"+dir, storage.Options{Namespace: ns, OnWarning: w.add})
		defer s.Close()
		keys, fan := fanOutKeys(t, s, ns, 1)
		victim, intact := victimDir(t)
		symlink(t, victim, fan)
		if err := s.Put(testCtx(t), keys, [][]byte{[]byte("page")}); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(testCtx(t), keys); err != nil {
			t.Fatal(err)
		}
		if err := s.Clear(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		intact("put, delete and clear through a linked fan-out directory")
		w.mu.Lock()
		defer w.mu.Unlock()
		var got []string
		for _, e := range w.errs {
			var oe *storage.OpError
			if errors.As(e, &oe) && errors.Is(e, storage.ErrLink) {
				got = append(got, oe.Op+": "+oe.Err.Error())
			}
		}
		want := []string{
			"put: " + fan + ": skipped, not followed",
			"delete: " + fan + ": skipped, not followed",
			"clear: " + fan + ": removed (the link itself, never its target)",
		}
		if len(got) != len(want) {
			t.Fatalf("link warnings %q, want %q", got, want)
		}
		for i := range want {
			// Clear reports the link where it met it: in the trash it moved the namespace to.
			if got[i] != want[i] && !(i == 2 && strings.HasPrefix(got[i], "clear: "+dir+"/.trash-") &&
				strings.HasSuffix(got[i], "/"+filepath.Base(fan)+": removed (the link itself, never its target)")) {
				t.Errorf("link warning %d: %q, want %q", i, got[i], want[i])
			}
		}
	})
}

// TestDirClearReapsDeadClearsTrash: an empty trash directory older than TempMaxAge (a Clear
// that died between making it and moving the namespace into it) is removed by the next
// Clear; a recent empty one (a concurrent Clear about to move its namespace in) is kept.
func TestDirClearReapsDeadClearsTrash(t *testing.T) {
	dir := t.TempDir()
	ns := mustNamespace(t, "dead-trash")
	s := openURL(t, "file://"+dir, storage.Options{Namespace: ns})
	defer s.Close()
	dead := filepath.Join(dir, ".trash-"+ns.String()+"-dead")
	recent := filepath.Join(dir, ".trash-"+ns.String()+"-recent")
	for _, d := range []string{dead, recent} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-stores.TempMaxAge - time.Minute)
	if err := os.Chtimes(dead, old, old); err != nil {
		t.Fatal(err)
	}
	if err := s.Clear(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(dead); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a dead Clear's empty trash %s is still there (%v)", dead, err)
	}
	if _, err := os.Lstat(recent); err != nil {
		t.Errorf("a recent empty trash (a Clear in progress) was removed: %v", err)
	}
}
