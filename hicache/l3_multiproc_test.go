package hicache

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache/kvtest"
	"github.com/cpcache/cpcache/internal/testenv/multiproc"
	"github.com/cpcache/cpcache/parallel"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// roleL3 is one rank of a Gloo job with two slab groups (TP 2 × CP 2) and a directory
// storage shared by every process and by consecutive jobs. With CPCACHE_TEST_INSERT=1 it
// inserts a seeded set of sequences (backed up to storage) and evicts everything; then it
// prefetches every sequence under random per-rank storage delays, loads it back, verifies
// the content of its own pages and records the digests after every step.
func roleL3(ctx context.Context, world *gloo.Group) error {
	shard := 0
	c, _, cleanup, err := mpSetup(ctx, world, 2, 48, Options{PageSize: 4, L1Pages: 64, LoadQuotaPages: 64}, 200*time.Microsecond,
		func(cfg *Config, l *parallel.Layout) error {
			ns, err := storage.NewNamespace("hicache-multiproc;page_tokens=4;page_bytes=64;tp=2")
			if err != nil {
				return err
			}
			st, err := stores.Open(ctx, os.Getenv("CPCACHE_TEST_STORAGE"), storage.Options{Namespace: ns})
			if err != nil {
				return err
			}
			shard = l.Coord(cfg.Rank).TP
			cfg.Storage, cfg.StorageNamespace = st, ns
			cfg.L3 = L3Options{PrefetchPolicy: PrefetchWaitComplete, ReadChunkPages: 2,
				hook: randomDelays(23, time.Millisecond)(cfg.Rank)}
			return nil
		})
	if err != nil {
		return err
	}
	defer cleanup()
	var b strings.Builder
	step := func() error {
		if err := c.Step(ctx); err != nil {
			return err
		}
		if err := c.core.CheckInvariants(); err != nil {
			return err
		}
		fmt.Fprintf(&b, "state %#x placement %#x\n", c.StateDigest(), c.Stats().PlacementDigest)
		return nil
	}
	drain := func() error {
		for c.Pending() > 0 {
			if err := step(); err != nil {
				return err
			}
		}
		return nil
	}
	seqs := kvtest.RandomSequences(rand.New(rand.NewPCG(29, 29)), 12, 4)
	if os.Getenv("CPCACHE_TEST_INSERT") == "1" {
		for _, s := range seqs {
			res, err := c.Insert(Request{Tokens: s})
			if err != nil {
				return err
			}
			for _, f := range res.Fill {
				if c.Owns(f.Index) {
					p, err := c.L1Page(f.Slot)
					if err != nil {
						return err
					}
					kvtest.FillKV(p, f.Hash.Index(), f.Index, shard)
				}
			}
			if err := step(); err != nil {
				return err
			}
			if err := drain(); err != nil {
				return err
			}
		}
		if _, _, err := c.EvictL1(1 << 30); err != nil {
			return err
		}
		if err := drain(); err != nil {
			return err
		}
		if _, err := c.EvictL2(1 << 30); err != nil {
			return err
		}
	}
	loaded := 0
	for _, s := range seqs {
		pf, err := c.Prefetch(Request{Tokens: s})
		if err != nil {
			return err
		}
		for c.PrefetchPending(pf.ID) {
			if err := step(); err != nil {
				return err
			}
		}
		m, err := c.Match(Request{Tokens: s})
		if err != nil {
			return err
		}
		if m.HostPages > 0 {
			if m, err = loadBackAndWait(c, s, m, step); err != nil {
				return err
			}
		}
		if err := c.WaitL1(ctx, m.Last); err != nil {
			return err
		}
		if err := verifyOwnPages(c, m, shard, c.L1Page); err != nil {
			return err
		}
		loaded += m.DevicePages
		if err := step(); err != nil {
			return err
		}
	}
	if err := drain(); err != nil {
		return err
	}
	st := c.Stats()
	fmt.Fprintf(&b, "hit %d prefetched %d backedup %d loaded %d\n", st.L3HitPages, st.L3PrefetchedPages, st.L3BackedUpPages, loaded)
	return multiproc.Report([]byte(b.String()))
}

// TestMultiprocGlooL3 runs two Gloo jobs of 4 rank processes, one after the other, on one
// storage directory: the first inserts (backing up to storage), evicts everything and
// prefetches it back; the second starts empty and prefetches every prefix the first stored.
// Every rank records identical digests at every step, and every page loaded is verified.
func TestMultiprocGlooL3(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test skipped in -short mode")
	}
	dir := t.TempDir()
	run := func(insert bool) string {
		flag := "0"
		if insert {
			flag = "1"
		}
		res := multiproc.Run(t, multiproc.Spec{Role: "hicache-l3", N: 4, Timeout: 3 * time.Minute,
			Env: mpEnv(t, "CPCACHE_TEST_STORAGE=file://"+dir, "CPCACHE_TEST_INSERT="+flag)})
		if t.Failed() {
			t.FailNow()
		}
		lines := sameReports(t, res, 1) // the last line has this rank's load count
		return lines[len(lines)-1]
	}
	var hit, pre, backed, loaded [2]int
	for i, insert := range []bool{true, false} {
		summary := run(insert)
		if _, err := fmt.Sscanf(summary, "hit %d prefetched %d backedup %d loaded %d", &hit[i], &pre[i], &backed[i], &loaded[i]); err != nil {
			t.Fatal(err)
		}
		t.Logf("run %d: %s", i+1, summary)
	}
	if backed[0] == 0 || pre[0] != backed[0] || pre[1] != backed[0] || loaded[1] == 0 {
		t.Fatalf("first run backed up %d pages and prefetched %d; second prefetched %d (loaded %d)", backed[0], pre[0], pre[1], loaded[1])
	}
}
