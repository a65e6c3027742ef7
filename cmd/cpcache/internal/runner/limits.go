package runner

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/internal/redact"
)

// Upper bounds of the configuration, so that no product of them overflows and a typo is a
// clear error instead of an impossible job.
const (
	MaxPageTokens        = 1 << 20 // tokens per page
	MaxKVBytesPerToken   = 1 << 24 // bytes of one rank's KV shard per token
	MaxPagesPerPool      = math.MaxInt32
	MaxBatchTokens       = 1 << 30
	MaxRunningPerReplica = 1 << 20
)

// checkBounds rejects values over their bound; with them, every size below fits an int64.
func (c *Config) checkBounds() error {
	for _, v := range []struct {
		name   string
		v, max int
	}{{"page size", c.PageSize, MaxPageTokens}, {"KV bytes per token", c.KVBytesPerToken, MaxKVBytesPerToken},
		{"L1 pages", c.L1Pages, MaxPagesPerPool}, {"L2 pages", c.L2Pages, MaxPagesPerPool},
		{"batch tokens", c.BatchTokens, MaxBatchTokens}, {"max running", c.MaxRunning, MaxRunningPerReplica}} {
		if v.v > v.max {
			return bad("%s %d is over the limit of %d", v.name, v.v, v.max)
		}
	}
	return nil
}

// checkStore checks an explicit rendezvous store URL (reachable, usable) so that a bad one
// is a bad input before any rank starts; the error never quotes a password.
func (c *Config) checkStore() error {
	if c.Store == "" {
		return nil
	}
	if err := gloo.CheckStore(context.Background(), c.Store); err != nil {
		return bad("--store %s: %v", redact.URL(c.Store), redact.Error(err, c.Store))
	}
	return nil
}

// RankBytes is the host memory one rank needs at least: its L1 pool, its L2 slab and its copy
// of the workload's prompt tokens. With --device cuda the L1 pool is device memory, and so is
// the L2 slab with --l2 device: they count 0 here.
func (p *Plan) RankBytes() (l1, l2, workload int64) {
	c := &p.Config
	page := int64(c.PageBytes())
	tokens := int64(0)
	for _, r := range p.Requests {
		tokens += int64(len(r.Tokens))
	}
	l1, l2 = int64(c.L1Pages)*page, int64(c.L2Pages)*page
	if c.Device == DeviceCUDA {
		l1 = 0
		if c.L2 == L2Device {
			l2 = 0
		}
	}
	return l1, l2, 4 * tokens
}

// CheckHost checks that localRanks ranks of the plan fit this host's available memory
// (MemAvailable, and the cgroup's memory.max when set). The L2 slabs are anonymous shared
// memory (memfd), which counts against the same memory and not against /dev/shm.
func (p *Plan) CheckHost(localRanks int) error {
	avail, source, ok := availableMemory()
	if !ok {
		return nil
	}
	l1, l2, wl := p.RankBytes()
	per := l1 + l2 + wl
	if need := int64(localRanks) * per; per > 0 && (need/per != int64(localRanks) || need > avail) {
		return bad("%d local ranks need %s (per rank: L1 %d pages %s, L2 slab %d pages %s, workload %s), more than the %s of memory available (%s)",
			localRanks, gib(float64(localRanks)*float64(per)), p.Config.L1Pages, gib(float64(l1)), p.Config.L2Pages, gib(float64(l2)), gib(float64(wl)), gib(float64(avail)), source)
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
// room left under the cgroup v2 limit when there is one.
func availableMemory() (int64, string, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	var avail int64 = -1
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
	source := "MemAvailable"
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
