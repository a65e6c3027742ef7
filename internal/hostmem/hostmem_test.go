package hostmem

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestPageCacheOf: the page cache of a cgroup counts as available, as in MemAvailable; an
// engine that had read its model weights (page cache charged to its cgroup) was refused
// pools that fit. A v1 memory.stat's total_* lines (the cgroup and its descendants, what its
// usage counts) are used when it has them.
func TestPageCacheOf(t *testing.T) {
	stat := "anon 1000\nfile 7000\nshmem 4000\nactive_file 2000\ninactive_file 1000\nactive_anon 900\n"
	if got := pageCacheOf([]byte(stat), true); got != 3000 {
		t.Errorf("pageCacheOf = %d, want 3000 (active_file + inactive_file; not shmem)", got)
	}
	if got := pageCacheOf(nil, true); got != 0 {
		t.Errorf("pageCacheOf(nil) = %d", got)
	}
	v1 := "active_file 10\ninactive_file 20\ntotal_active_file 100\ntotal_inactive_file 200\n"
	if got := pageCacheOf([]byte(v1), false); got != 300 {
		t.Errorf("v1 pageCacheOf = %d, want 300 (total_active_file + total_inactive_file)", got)
	}
}

// TestAvailable: on Linux /proc/meminfo says, and the figure is positive.
func TestAvailable(t *testing.T) {
	avail, source, ok := Available()
	if !ok {
		t.Skip("/proc/meminfo has no MemAvailable here")
	}
	if avail <= 0 || source == "" {
		t.Fatalf("Available() = %d, %q", avail, source)
	}
	t.Logf("%s available (%s)", GiB(float64(avail)), source)
}

func TestGiB(t *testing.T) {
	for b, want := range map[float64]string{512 << 20: "512.0 MiB", 3 << 30: "3.0 GiB"} {
		if got := GiB(b); got != want {
			t.Errorf("GiB(%v) = %q, want %q", b, got, want)
		}
	}
}

const mib = 1 << 20

// fakeHost is a fake /proc and cgroup tree under a temporary directory.
type fakeHost struct {
	t    *testing.T
	root string
}

func newFakeHost(t *testing.T, memAvailable int64, cgroup string) *fakeHost {
	h := &fakeHost{t, t.TempDir()}
	h.write("proc/meminfo", "MemTotal:       99999999 kB\nMemAvailable:   "+itoa(memAvailable>>10)+" kB\n")
	h.write("proc/self/cgroup", cgroup)
	return h
}

func (h *fakeHost) roots() Roots {
	return Roots{Proc: filepath.Join(h.root, "proc"), Cgroup: filepath.Join(h.root, "sys/fs/cgroup")}
}

func (h *fakeHost) path(rel string) string { return filepath.Join(h.root, rel) }

func (h *fakeHost) write(rel, content string) {
	h.t.Helper()
	p := h.path(rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		h.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

// cgroup writes the memory files of the cgroup at dir (v2 names, or v1 when v1).
func (h *fakeHost) cgroup(dir string, v1 bool, limit string, usage int64, stat string) {
	limitFile, usageFile := "memory.max", "memory.current"
	if v1 {
		limitFile, usageFile = "memory.limit_in_bytes", "memory.usage_in_bytes"
	}
	h.write(dir+"/"+limitFile, limit+"\n")
	h.write(dir+"/"+usageFile, itoa(usage)+"\n")
	h.write(dir+"/memory.stat", stat)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func requireAvailable(t *testing.T, r Roots, want int64, wantSource string) {
	t.Helper()
	got, source, ok := r.Available()
	if !ok || got != want || source != wantSource {
		t.Fatalf("Available() = %d (%s), %q, %v; want %d (%s), %q", got, GiB(float64(got)), source, ok, want, GiB(float64(want)), wantSource)
	}
}

// TestAvailableV2Hierarchy: a cgroup v2 limit set on an ancestor (a Kubernetes pod, a
// systemd slice) binds the processes of its children, whose own memory.max is "max"; the
// tightest room of the cgroup and its ancestors wins. Only the leaf was read before.
func TestAvailableV2Hierarchy(t *testing.T) {
	h := newFakeHost(t, 8<<30, "0::/pod/job\n")
	cg := h.path("cg2")
	h.write("proc/self/mountinfo", "25 1 0:26 / "+cg+" rw,nosuid shared:4 - cgroup2 cgroup2 rw\n")
	h.cgroup("cg2", false, "max", 300*mib, "")
	h.cgroup("cg2/pod", false, itoa(1<<30), 200*mib, "active_file 60000000\ninactive_file 40000000\n")
	h.cgroup("cg2/pod/job", false, "max", 150*mib, "")
	requireAvailable(t, h.roots(), 1<<30-200*mib+100000000, "cgroup memory.max of /pod")
	// A tighter limit on the leaf wins over its parent's.
	h.cgroup("cg2/pod/job", false, itoa(400*mib), 150*mib, "")
	requireAvailable(t, h.roots(), 250*mib, "cgroup memory.max of /pod/job")
}

// TestAvailableV1: under cgroup v1 (the memory controller's own hierarchy) the limit is
// memory.limit_in_bytes less memory.usage_in_bytes plus the page cache; the kernel's "no
// limit" (9223372036854771712) is none. A v1 limit left unread lets ranks start that the
// kernel then OOM-kills.
func TestAvailableV1(t *testing.T) {
	h := newFakeHost(t, 8<<30, "12:pids:/x\n4:memory:/batch/job7\n1:name=systemd:/x\n0::/x\n")
	v1 := h.path("v1mem")
	h.write("proc/self/mountinfo",
		"30 25 0:27 / "+h.path("cg2")+" rw - cgroup2 cgroup2 rw\n"+
			"35 25 0:32 / "+v1+" rw,relatime shared:9 - cgroup cgroup rw,memory\n"+
			"36 25 0:33 / "+h.path("v1pids")+" rw,relatime - cgroup cgroup rw,pids\n")
	h.cgroup("v1mem", true, "9223372036854771712", 5<<30, "total_inactive_file 1000\n")
	h.cgroup("v1mem/batch", true, "9223372036854771712", 600*mib, "")
	h.cgroup("v1mem/batch/job7", true, itoa(512*mib), 100*mib, "active_file 7\ntotal_active_file 30000000\ntotal_inactive_file 20000000\n")
	requireAvailable(t, h.roots(), 412*mib+50000000, "cgroup memory.limit_in_bytes of /batch/job7")
}

// TestAvailableV1ContainerRoot: a container that sees only its own part of the hierarchy
// has it mounted with that cgroup as root (mountinfo's root field); /proc/self/cgroup names
// the full path.
func TestAvailableV1ContainerRoot(t *testing.T) {
	h := newFakeHost(t, 8<<30, "9:cpu,memory:/docker/abc\n")
	v1 := h.path("sys/fs/cgroup/cpu,memory")
	h.write("proc/self/mountinfo", "35 25 0:32 /docker/abc "+v1+" rw - cgroup cgroup rw,cpu,memory\n")
	h.cgroup("sys/fs/cgroup/cpu,memory", true, itoa(256*mib), 6*mib, "")
	requireAvailable(t, h.roots(), 250*mib, "cgroup memory.limit_in_bytes of /docker/abc")
}

// TestAvailableHybridAndDefaults: without mountinfo the usual mount points are read; with
// both hierarchies the tighter limit wins; MemAvailable wins when it is tighter.
func TestAvailableHybridAndDefaults(t *testing.T) {
	h := newFakeHost(t, 8<<30, "4:memory:/a\n0::/a\n")
	h.cgroup("sys/fs/cgroup/memory/a", true, itoa(2<<30), 0, "")
	h.cgroup("sys/fs/cgroup/a", false, itoa(1<<30), 0, "")
	requireAvailable(t, h.roots(), 1<<30, "cgroup memory.max of /a")
	h.cgroup("sys/fs/cgroup/memory/a", true, itoa(512*mib), 0, "")
	requireAvailable(t, h.roots(), 512*mib, "cgroup memory.limit_in_bytes of /a")
	h.cgroup("sys/fs/cgroup/a", false, itoa(64<<30), 0, "")
	h.cgroup("sys/fs/cgroup/memory/a", true, itoa(64<<30), 0, "")
	requireAvailable(t, h.roots(), 8<<30, "MemAvailable")
	// A cgroup path outside the mount's root (another namespace's) is not followed up.
	h.write("proc/self/mountinfo", "35 25 0:32 /other "+h.path("sys/fs/cgroup/memory")+" rw - cgroup cgroup rw,memory\n")
	h.write("proc/self/cgroup", "4:memory:/a\n")
	requireAvailable(t, h.roots(), 8<<30, "MemAvailable")
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/mnt/a\040b\134c`); got != `/mnt/a b\c` {
		t.Errorf("unescapeMount = %q", got)
	}
}
