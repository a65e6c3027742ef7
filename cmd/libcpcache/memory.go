package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The host-memory check of cpcache_open (as `cpcache run` makes its own before any rank
// starts): the pools this rank allocates must fit the memory available, or a typo in
// l1_pages or l2_pages gets the process killed by the kernel instead of an error.

// hostBytes is the host memory this rank's pools take: the L1 pool it allocates
// (CPCACHE_L1_ALLOC) and its host L2 slab. checkConfig bounded each product by MaxInt64.
func hostBytes(c *openConfig) (l1, l2 int64) {
	if c.l1Kind == l1Alloc {
		l1 = int64(c.l1Pages) * int64(c.pageBytes)
	}
	if c.slabKind == slabHost {
		l2 = int64(c.l2Pages) * int64(c.pageBytes)
	}
	return l1, l2
}

// checkHostMemory refuses pools larger than avail bytes (from source, for the message).
func checkHostMemory(c *openConfig, avail int64, source string) error {
	l1, l2 := hostBytes(c)
	if l1 > avail || l2 > avail-l1 {
		return fmt.Errorf("%w: l1_pages %d and l2_pages %d of page_bytes %d need %s of host memory (L1 pool %s, L2 slab %s), more than the %s available (%s)",
			errInvalid, c.l1Pages, c.l2Pages, c.pageBytes, gib(float64(l1)+float64(l2)), gib(float64(l1)), gib(float64(l2)), gib(float64(avail)), source)
	}
	return nil
}

// gib formats a byte count in GiB, or MiB below one GiB.
func gib(b float64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", b/(1<<30))
}

// availableMemory is the memory this process may still use: MemAvailable, lowered to the
// room left under the cgroup v2 limit when there is one; ok is false when unknown.
func availableMemory() (avail int64, source string, ok bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	avail = -1
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, found := strings.CutPrefix(sc.Text(), "MemAvailable:"); found {
			if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64); err == nil {
				avail = kb << 10
			}
		}
	}
	if avail < 0 {
		return 0, "", false
	}
	source = "MemAvailable"
	if limit, found := readCgroupInt("memory.max"); found {
		cur, _ := readCgroupInt("memory.current")
		if room := limit - cur + cgroupPageCache(); room < avail {
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
