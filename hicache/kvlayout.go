package hicache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/cpcache/cpcache/hicache/kvlayout"
	"github.com/cpcache/cpcache/hicache/kvmem"
)

// checkKVLayout checks a KV layout against the page size it is used with: it validates, and
// one page of pageTokens tokens on one attention-TP rank of attnTP takes pageBytes bytes
// (the slab page size). nil (opaque pages) passes.
func checkKVLayout(kv *kvlayout.Layout, pageTokens, attnTP, pageBytes int) error {
	if kv == nil {
		return nil
	}
	pb, err := kv.PageBytes(pageTokens, attnTP)
	if err != nil {
		return fmt.Errorf("%w: KV layout %s: %w", ErrBadConfig, kv, err)
	}
	if pb != int64(pageBytes) {
		return fmt.Errorf("%w: KV layout %s takes %d bytes per page of %d tokens at attention-TP %d, the slab page size is %d bytes",
			ErrBadConfig, kv, pb, pageTokens, attnTP, pageBytes)
	}
	return nil
}

// checkKVMem checks Config.L1 and Config.L2Layout against the KV layout and the core's page
// size and L1 slots, and returns the L2 layout in use (PageFirst for 0).
func checkKVMem(cfg Config, pageTokens, l1Pages int) (kvmem.L2Layout, error) {
	lay := cfg.L2Layout
	if lay == 0 {
		lay = kvmem.PageFirst
	}
	if !lay.Valid() {
		return 0, fmt.Errorf("%w: L2 layout %s is neither page_first nor layer_first", ErrBadConfig, lay)
	}
	if cfg.KVLayout == nil {
		if cfg.L1 != nil || lay == kvmem.LayerFirst {
			return 0, fmt.Errorf("%w: an L1 of per-layer buffers or a layer_first L2 needs Config.KVLayout", ErrBadConfig)
		}
		return lay, nil
	}
	if cfg.L1 == nil {
		return lay, nil
	}
	s := cfg.L1.Shape()
	if d := s.Layout().Diff(*cfg.KVLayout); d != "" {
		return 0, fmt.Errorf("%w: the L1's layout differs from Config.KVLayout: %s", ErrBadConfig, d)
	}
	if s.AttnTP() != cfg.Layout.AttnTP || s.PageTokens() != pageTokens {
		return 0, fmt.Errorf("%w: the L1's shape is for attention-TP %d and %d-token pages, the cache has attention-TP %d and %d-token pages",
			ErrBadConfig, s.AttnTP(), s.PageTokens(), cfg.Layout.AttnTP, pageTokens)
	}
	if cfg.L1.Slots() < l1Pages {
		return 0, fmt.Errorf("%w: the L1 has %d page slots, the cache's L1 holds %d pages", ErrBadConfig, cfg.L1.Slots(), l1Pages)
	}
	if cfg.L1.Device() && cfg.Engine == nil {
		return 0, fmt.Errorf("%w: a device L1 needs an Engine (the host engine copies host memory)", ErrBadConfig)
	}
	return lay, nil
}

// kvLayoutEncoding is what ranks compare: the layout's canonical encoding, empty for nil.
func kvLayoutEncoding(kv *kvlayout.Layout) []byte {
	if kv == nil {
		return nil
	}
	return kv.Encode()
}

// kvLayoutHash is a 62-bit hash of kvLayoutEncoding, for New's AllReduce (MIN of it and of
// its negation): equal on every rank exactly when the reduced pair is (h, -h). 62 bits keep
// the negation and MaxInt64 (the failed-rank slot's neutral value) apart.
func kvLayoutHash(kv *kvlayout.Layout) int64 {
	sum := sha256.Sum256(kvLayoutEncoding(kv))
	return int64(binary.LittleEndian.Uint64(sum[:8]) & (1<<62 - 1))
}

// agreeKVLayout gathers every rank's layout encoding on the group and returns the
// *LayoutMismatchError naming the lowest rank whose layout differs from the group's first
// rank's and the first difference; every rank computes it from the same gathered bytes. New
// calls it on every rank once its AllReduce showed the layouts differ.
func agreeKVLayout(ctx context.Context, cfg Config) error {
	g := cfg.Group
	var all [][]byte
	err := collective(ctx, cfg.StepTimeout, func(ctx context.Context) (err error) {
		all, err = g.AllGather(ctx, kvLayoutEncoding(cfg.KVLayout))
		return err
	})
	if err != nil {
		return fmt.Errorf("%w: KV layouts differ across ranks of group %s; gathering them: %w", ErrLayoutMismatch, g.Name(), err)
	}
	ranks := g.Ranks()
	for r := 1; r < len(all); r++ {
		if !bytes.Equal(all[r], all[0]) {
			return &LayoutMismatchError{Rank: ranks[r], First: ranks[0], Group: g.Name(), Diff: describeKVDiff(all[0], all[r])}
		}
	}
	// The hashes differed but the encodings do not: the collective's ranks disagree on what
	// they saw, which only a broken group can do.
	return fmt.Errorf("%w: KV layout hashes differ across ranks of group %s but their encodings are equal", ErrLayoutMismatch, g.Name())
}

// describeKVDiff names the first difference between two encodings (a first, b second).
func describeKVDiff(a, b []byte) string {
	decode := func(enc []byte) (string, *kvlayout.Layout) {
		if len(enc) == 0 {
			return "no KV layout", nil
		}
		l, err := kvlayout.Decode(enc)
		if err != nil {
			return fmt.Sprintf("an invalid KV layout (%v)", err), nil
		}
		return l.String(), &l
	}
	as, al := decode(a)
	bs, bl := decode(b)
	if al != nil && bl != nil {
		return al.Diff(*bl)
	}
	return as + " vs " + bs
}
