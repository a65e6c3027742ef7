package hicache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/cpcache/cpcache/hicache/kvlayout"
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
