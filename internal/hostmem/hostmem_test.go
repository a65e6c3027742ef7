package hostmem

import "testing"

// TestPageCacheOf: the page cache of a cgroup counts as available, as in MemAvailable; an
// engine that had read its model weights (page cache charged to its cgroup) was refused
// pools that fit.
func TestPageCacheOf(t *testing.T) {
	stat := "anon 1000\nfile 7000\nshmem 4000\nactive_file 2000\ninactive_file 1000\nactive_anon 900\n"
	if got := pageCacheOf([]byte(stat)); got != 3000 {
		t.Errorf("pageCacheOf = %d, want 3000 (active_file + inactive_file; not shmem)", got)
	}
	if got := pageCacheOf(nil); got != 0 {
		t.Errorf("pageCacheOf(nil) = %d", got)
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
