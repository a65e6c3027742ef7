// Package hostmem tells how much host memory a process may still use, so that pools a
// configuration asks for are refused with an error naming their sizes instead of getting the
// process killed by the kernel. It reads /proc/meminfo and the memory limits of this
// process's cgroup and of every cgroup above it, under cgroup v2 (memory.max) and cgroup v1
// (memory.limit_in_bytes); it allocates nothing and keeps no state.
package hostmem

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GiB formats a byte count in GiB, or MiB below one GiB.
func GiB(b float64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", b/(1<<30))
}

// Roots are where the kernel's files are read from; tests point them at a fake tree.
type Roots struct {
	Proc   string // procfs: meminfo, self/cgroup, self/mountinfo ("/proc")
	Cgroup string // where cgroup file systems are mounted when mountinfo does not say ("/sys/fs/cgroup")
}

// System are the roots of the running system.
var System = Roots{Proc: "/proc", Cgroup: "/sys/fs/cgroup"}

// Available is the memory this process may still use (see Roots.Available).
func Available() (avail int64, source string, ok bool) { return System.Available() }

// v1Unlimited: a cgroup v1 limit at or above it is no limit (the kernel writes "no limit"
// as the largest page count times the page size, 9223372036854771712 with 4 KiB pages).
const v1Unlimited = 1 << 62

// Available is the memory this process may still use: MemAvailable, lowered to the room
// left under the tightest cgroup memory limit of this process's cgroup and its ancestors
// (cgroup v2 memory.max, cgroup v1 memory.limit_in_bytes; both where a host mounts both),
// with source naming which (the file and the cgroup's path); ok is false when meminfo does
// not say. The room under a limit is the limit less the usage, plus the page cache charged
// to the cgroup, which the kernel reclaims before it kills.
func (r Roots) Available() (avail int64, source string, ok bool) {
	avail, ok = r.memAvailable()
	if !ok {
		return 0, "", false
	}
	source = "MemAvailable"
	cg, _ := os.ReadFile(filepath.Join(r.Proc, "self", "cgroup"))
	mounts := r.cgroupMounts()
	for line := range strings.Lines(string(cg)) {
		// hierarchy-ID:controllers:path; v2 is "0::/path", v1 memory "N:memory:/path"
		// (or with other controllers, comma-separated).
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var m mount
		var v2 bool
		switch {
		case parts[0] == "0" && parts[1] == "":
			m, v2 = mounts.v2, true
		case hasController(parts[1], "memory"):
			m = mounts.v1
		default:
			continue
		}
		if room, where, ok := tightest(m, parts[2], v2); ok && room < avail {
			name := "memory.limit_in_bytes"
			if v2 {
				name = "memory.max"
			}
			avail, source = room, fmt.Sprintf("cgroup %s of %s", name, where)
		}
	}
	return avail, source, true
}

func hasController(list, name string) bool {
	for c := range strings.SplitSeq(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// memAvailable is MemAvailable of meminfo.
func (r Roots) memAvailable() (int64, bool) {
	f, err := os.Open(filepath.Join(r.Proc, "meminfo"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// mount is where a cgroup hierarchy is mounted (dir) and which cgroup that directory is
// (root: "/" on a host, the container's own cgroup when a container sees only its part).
type mount struct{ dir, root string }

type mounts struct{ v1, v2 mount }

// cgroupMounts finds the cgroup v2 mount and the cgroup v1 mount of the memory controller
// in mountinfo; where it does not say, the usual places under r.Cgroup.
func (r Roots) cgroupMounts() mounts {
	ms := mounts{v1: mount{filepath.Join(r.Cgroup, "memory"), "/"}, v2: mount{r.Cgroup, "/"}}
	b, err := os.ReadFile(filepath.Join(r.Proc, "self", "mountinfo"))
	if err != nil {
		return ms
	}
	var haveV1, haveV2 bool
	for line := range strings.Lines(string(b)) {
		// ID parent major:minor root mountpoint options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(strings.TrimSpace(line), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 {
			continue
		}
		m := mount{dir: unescapeMount(f[4]), root: unescapeMount(f[3])}
		switch {
		case g[0] == "cgroup2" && !haveV2:
			ms.v2, haveV2 = m, true
		case g[0] == "cgroup" && !haveV1 && len(g) >= 3 && hasController(g[2], "memory"):
			ms.v1, haveV1 = m, true
		}
	}
	return ms
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// tightest is the least room under the memory limits of cgroup path and its ancestors up to
// the mount's root, and the path of the cgroup whose limit it is; ok is false when none of
// them has a limit (or the cgroup is not under the mount).
func tightest(m mount, path string, v2 bool) (room int64, where string, ok bool) {
	path = filepath.Clean("/" + path)
	rel, err := filepath.Rel(filepath.Clean("/"+m.root), path)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return 0, "", false
	}
	for {
		dir := filepath.Join(m.dir, rel)
		if r, limited := roomIn(dir, v2); limited && (!ok || r < room) {
			room, where, ok = r, filepath.Join(filepath.Clean("/"+m.root), rel), true
		}
		if rel == "." {
			return room, where, ok
		}
		rel = filepath.Dir(rel)
	}
}

// roomIn is the room under the memory limit of the cgroup at dir; limited is false when it
// sets none (or the files are not there).
func roomIn(dir string, v2 bool) (room int64, limited bool) {
	limitFile, usageFile := "memory.limit_in_bytes", "memory.usage_in_bytes"
	if v2 {
		limitFile, usageFile = "memory.max", "memory.current"
	}
	limit, ok := readInt(filepath.Join(dir, limitFile))
	if !ok || !v2 && limit >= v1Unlimited {
		return 0, false
	}
	usage, _ := readInt(filepath.Join(dir, usageFile))
	stat, _ := os.ReadFile(filepath.Join(dir, "memory.stat"))
	return limit - usage + pageCacheOf(stat, v2), true
}

// readInt reads a number from a cgroup file ("max", as v2 writes no limit: not ok).
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// pageCacheOf is the page cache a memory.stat lists (0 for none): active_file and
// inactive_file (shared memory is not in them). Usage counts it, but the kernel reclaims it
// before it kills, and MemAvailable counts it available too: without it, an engine that has
// read its model weights looks out of memory. A v1 memory.stat also lists total_active_file
// and total_inactive_file, the cgroup's and its descendants', which is what its usage counts.
func pageCacheOf(stat []byte, v2 bool) int64 {
	want := [2]string{"active_file", "inactive_file"}
	if !v2 && strings.Contains(string(stat), "total_active_file ") {
		want = [2]string{"total_active_file", "total_inactive_file"}
	}
	var n int64
	for line := range strings.Lines(string(stat)) {
		name, num, _ := strings.Cut(strings.TrimSpace(line), " ")
		if name == want[0] || name == want[1] {
			if x, err := strconv.ParseInt(num, 10, 64); err == nil {
				n += x
			}
		}
	}
	return n
}
