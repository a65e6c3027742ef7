// Package hostmem tells how much host memory a process may still use, so that pools a
// configuration asks for are refused with an error naming their sizes instead of getting the
// process killed by the kernel. It reads /proc/meminfo and this process's cgroup v2 files;
// it allocates nothing and keeps no state.
package hostmem

import (
	"bufio"
	"fmt"
	"os"
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

// Available is the memory this process may still use: MemAvailable, lowered to the room
// left under the cgroup v2 limit (memory.max) when there is one, with source naming which;
// ok is false when /proc/meminfo does not say.
func Available() (avail int64, source string, ok bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	avail = -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				avail = kb << 10
			}
		}
	}
	if avail < 0 {
		return 0, "", false
	}
	source = "MemAvailable"
	if max, ok := readCgroupInt("memory.max"); ok {
		cur, _ := readCgroupInt("memory.current")
		if room := max - cur + cgroupPageCache(); room < avail {
			avail, source = room, "cgroup memory.max"
		}
	}
	return avail, source, true
}

// readCgroupInt reads a number from this process's cgroup v2 directory ("max": not set).
func readCgroupInt(name string) (int64, bool) {
	v, ok := readCgroupFile(name)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
	return n, err == nil
}

// cgroupPageCache is the page cache charged to this process's cgroup v2 (active_file and
// inactive_file of memory.stat; shared memory is not in them): memory.current counts it,
// but the kernel reclaims it before it kills, and MemAvailable counts it available too.
// Without it, an engine that has read its model weights looks out of memory.
func cgroupPageCache() int64 {
	stat, _ := readCgroupFile("memory.stat")
	return pageCacheOf(stat)
}

// pageCacheOf is the page cache a memory.stat lists (0 for none).
func pageCacheOf(stat []byte) int64 {
	var n int64
	for line := range strings.Lines(string(stat)) {
		name, num, _ := strings.Cut(strings.TrimSpace(line), " ")
		if name == "active_file" || name == "inactive_file" {
			if x, err := strconv.ParseInt(num, 10, 64); err == nil {
				n += x
			}
		}
	}
	return n
}

// readCgroupFile reads a file of this process's cgroup v2 directory.
func readCgroupFile(name string) ([]byte, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, false
	}
	// cgroup v2: one line "0::/path".
	path, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "0::")
	if !ok || strings.Contains(path, "\n") {
		return nil, false
	}
	v, err := os.ReadFile("/sys/fs/cgroup" + path + "/" + name)
	return v, err == nil
}
