package main

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// snapshotTree returns every file under dir (relative name → contents) and every directory
// (name → "<dir>"), without following links.
func snapshotTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out[rel] = "<dir>"
			return nil
		}
		b, err := os.ReadFile(p)
		out[rel] = string(b)
		return err
	}))
	return out
}

// victimTree makes a directory outside the store with a file and a subdirectory with a
// file, and returns it.
func victimTree(t *testing.T, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range append([]string{"precious.txt", filepath.Join("ab", "deep.txt")}, extra...) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("keep "+name), 0o600))
	}
	return dir
}

// namespaceDir returns the one namespace directory (16 hex digits) of the file store dir.
func namespaceDir(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var found []string
	for _, e := range ents {
		if _, err := hex.DecodeString(e.Name()); err == nil && len(e.Name()) == 16 {
			found = append(found, e.Name())
		}
	}
	require.Len(t, found, 1, "namespace directories in %s", dir)
	return filepath.Join(dir, found[0])
}

// TestRunStorageClearFollowsNoLinks runs the binary against a file store whose writer (the
// docs/operating.md's adversary) planted symbolic links: the namespace directory, a trash entry's ns
// and a trash entry itself pointing at directories outside the store, then every fan-out
// directory pointing at a directory holding (damaged) copies of the run's page files. The
// runs stay healthy; `--storage-clear` removes the links, not what they point to; backups
// write nothing, and purges delete nothing, outside the store: a clear that followed the
// links would empty every victim, and backups would write into the fan-out links' target.
func TestRunStorageClearFollowsNoLinks(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
	status, rep, out, errOut := runBinary(t, nil, append([]string{"--storage", url}, storageArgs...)...)
	requireHealthy(t, status, rep, out, errOut)
	nsDir := namespaceDir(t, dir)
	ns := filepath.Base(nsDir)

	// The namespace directory, a crashed clear's ns, and a trash entry are links.
	victimNS, victimTrash := victimTree(t), victimTree(t)
	victimEntry := victimTree(t, filepath.Join("ns", "page"))
	require.NoError(t, os.RemoveAll(nsDir))
	require.NoError(t, os.Symlink(victimNS, nsDir))
	require.NoError(t, os.Mkdir(filepath.Join(dir, ".trash-"+ns+"-1"), 0o700))
	require.NoError(t, os.Symlink(victimTrash, filepath.Join(dir, ".trash-"+ns+"-1", "ns")))
	require.NoError(t, os.Symlink(victimEntry, filepath.Join(dir, ".trash-"+ns+"-2")))
	before := map[string]map[string]string{}
	for _, v := range []string{victimNS, victimTrash, victimEntry} {
		before[v] = snapshotTree(t, v)
	}
	status, rep, out, errOut = runBinary(t, nil, append([]string{"--storage", url, "--storage-clear"}, storageArgs...)...)
	requireHealthy(t, status, rep, out, errOut)
	for v, snap := range before {
		assert.Equal(t, snap, snapshotTree(t, v), "--storage-clear changed %s, outside the store", v)
	}
	fi, err := os.Lstat(nsDir)
	require.NoError(t, err)
	assert.True(t, fi.IsDir(), "after --storage-clear the namespace is a real directory, not the link")
	left, _ := filepath.Glob(filepath.Join(dir, ".trash-*"))
	assert.Empty(t, left, "trash left after --storage-clear")
	assert.Contains(t, errOut, "symbolic link under the store", "the links are reported")
	assert.Zero(t, rep.TokensHitL3, "the store was cleared")

	// Every fan-out directory is a link to one directory that holds damaged copies of the
	// run's page files under their names (what a purge through the links would delete).
	victimFan := victimTree(t)
	fans, err := os.ReadDir(nsDir)
	require.NoError(t, err)
	require.NotEmpty(t, fans, "the cleared run backed pages up")
	for _, fan := range fans {
		pages, err := os.ReadDir(filepath.Join(nsDir, fan.Name()))
		require.NoError(t, err)
		for _, p := range pages {
			require.NoError(t, os.WriteFile(filepath.Join(victimFan, p.Name()), []byte("damaged "+p.Name()), 0o600))
		}
		require.NoError(t, os.RemoveAll(filepath.Join(nsDir, fan.Name())))
	}
	for b := range 256 {
		require.NoError(t, os.Symlink(victimFan, filepath.Join(nsDir, hex.EncodeToString([]byte{byte(b)}))))
	}
	snap := snapshotTree(t, victimFan)
	status, rep, out, errOut = runBinary(t, nil, append([]string{"--storage", url}, storageArgs...)...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Equal(t, snap, snapshotTree(t, victimFan), "backups or purges through linked fan-out directories changed what they point to")
	assert.Zero(t, rep.TokensHitL3, "nothing is read through the links")
	assert.Zero(t, rep.StorageRejected, "the damaged files outside the store are not read, so not rejected")
	assert.Contains(t, errOut, "symbolic link under the store")

	status, rep, out, errOut = runBinary(t, nil, append([]string{"--storage", url, "--storage-clear"}, storageArgs...)...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Equal(t, snap, snapshotTree(t, victimFan), "--storage-clear through linked fan-out directories changed what they point to")
	fans, err = os.ReadDir(nsDir)
	require.NoError(t, err)
	for _, fan := range fans {
		assert.True(t, fan.IsDir() && fan.Type()&os.ModeSymlink == 0, "after --storage-clear, %s is %v, not a real directory", fan.Name(), fan.Type())
	}
}

// TestRunWarnsOfAWritableStore: a store directory others can write is reported once, by
// the launcher, naming it and its mode.
func TestRunWarnsOfAWritableStore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, 0o777))
	status, rep, out, errOut := runBinary(t, nil, append([]string{"--storage", "file://" + dir}, storageArgs...)...)
	requireHealthy(t, status, rep, out, errOut)
	assert.Equal(t, 1, strings.Count(errOut, "writable by others"), "stderr:\n%s", errOut)
	assert.Contains(t, errOut, dir+" has mode drwxrwxrwx")
}
