package main

/*
#include "../../csrc/cpcache_capi.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/cpcache/cpcache/hicache"
)

// The engine-owned L1 slot calls (l1_mode CPCACHE_L1_ENGINE_OWNED); documentation in
// include/cpcache.h. Freed slots go to the caller's buffer; those that do not fit wait in
// session.freed for cpcache_take_freed_l1, so that a small buffer never loses a slot nor
// makes a replicated call fail on one rank after it took effect.

// slotList is the caller's slots[0..n) in place (read only during the call), NULL with 0
// being the empty list.
func slotList(p *C.int32_t, n C.size_t) ([]int32, error) {
	return tokenSlice(unsafe.Pointer(p), uint64(n), "slots")
}

// freedOut is a caller's buffer for the L1 pages a call frees: slot numbers (int32), or
// with locs every page's per-token locations (int64, slot·page_tokens + k), as the token
// location calls give them; cap is in entries and *n is set to the entries of all freed
// pages.
type freedOut struct {
	buf  unsafe.Pointer
	cap  uint64
	n    *C.size_t
	locs bool
}

func freedSlots(freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) freedOut {
	return freedOut{unsafe.Pointer(freed), uint64(freedCap), nFreed, false}
}

func freedLocations(freed *C.int64_t, freedCap C.size_t, nFreed *C.size_t) freedOut {
	return freedOut{unsafe.Pointer(freed), uint64(freedCap), nFreed, true}
}

// check checks the buffer and its count pointer before a call changes anything.
func (o freedOut) check() error {
	switch {
	case o.n == nil:
		return fmt.Errorf("%w: n_freed is NULL", errInvalid)
	case o.buf == nil && o.cap != 0:
		return fmt.Errorf("%w: freed is NULL with freed_cap %d", errInvalid, o.cap)
	}
	return nil
}

// splitFreed splits freed slots into those a caller's buffer of capacity entries takes (the
// first ones) and those left to queue.
func splitFreed(slots []int32, capacity uint64) (give, keep []int32) {
	k := min(uint64(len(slots)), capacity)
	return slots[:k], slots[k:]
}

// handBack writes slots to the caller's buffer o (whole pages only, as many as it holds),
// sets its count to the entries of all of them, and queues the slots that did not fit on the
// session, for cpcache_take_freed_l1 or cpcache_take_freed_locs.
func (s *session) handBack(slots []int32, o freedOut) {
	per := 1
	if o.locs {
		per = s.info.pageTokens
	}
	*o.n = C.size_t(len(slots) * per)
	give, keep := splitFreed(slots, o.cap/uint64(per))
	if len(give) > 0 {
		if o.locs {
			dst := unsafe.Slice((*int64)(o.buf), len(give)*per)
			for j, sl := range give {
				base := int64(sl) * int64(per)
				for k := range per {
					dst[j*per+k] = base + int64(k)
				}
			}
		} else {
			copy(unsafe.Slice((*int32)(o.buf), len(give)), give)
		}
	}
	s.freed = append(s.freed, keep...)
}

// evictInto evicts pages from L1 (Cache.EvictL1Slots) and hands the freed slots back
// through o; it returns the pages freed and those pending.
func (s *session) evictInto(pages int, o freedOut) (freed, pending int, err error) {
	freed, pending, slots, err := s.cache.EvictL1Slots(pages)
	if err != nil {
		return 0, 0, err
	}
	s.handBack(slots, o)
	return freed, pending, nil
}

// takeFreed hands back through o every freed slot queued: the session's, then the cache's
// (Cache.FreedL1).
func (s *session) takeFreed(o freedOut) {
	queued := append(s.freed, s.cache.FreedL1()...)
	s.freed = nil
	s.handBack(queued, o)
}

//export cpcapi_insert_slots
func cpcapi_insert_slots(c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, slots *C.int32_t, nSlots C.size_t,
	out *C.cpcache_insert_result, freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_insert_slots", func(s *session) error {
		k, err := keyString(key, uint64(keyLen))
		if err != nil {
			return err
		}
		toks, err := tokenSlice(unsafe.Pointer(tokens), uint64(n), "tokens")
		if err != nil {
			return err
		}
		own, err := slotList(slots, nSlots)
		if err != nil {
			return err
		}
		if out == nil {
			return fmt.Errorf("%w: out is NULL", errInvalid)
		}
		fo := freedSlots(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		// The tree keeps the tokens of new nodes (Go memory); the core does not keep own.
		res, err := s.cache.InsertSlots(hicache.Request{Tokens: append([]int32(nil), toks...), Key: k}, own)
		if err != nil {
			return err
		}
		*out = C.cpcache_insert_result{node: C.cpcache_node_t(res.Last), pages: C.int64_t(res.Pages), backups: C.int64_t(res.Backups)}
		s.handBack(res.Freed, fo)
		return nil
	})
}

//export cpcapi_load_back_plan
func cpcapi_load_back_plan(c C.cpcache_t, node C.cpcache_node_t, pages *C.int64_t, pagesCap C.size_t, nPages *C.size_t) (status C.int) {
	defer guard(&status)
	return nodeCall(c, node, "cpcache_load_back_plan", func(s *session, h hicache.Handle) error {
		switch {
		case nPages == nil:
			return fmt.Errorf("%w: n_pages is NULL", errInvalid)
		case pages == nil && pagesCap != 0:
			return fmt.Errorf("%w: pages is NULL with pages_cap %d", errInvalid, pagesCap)
		}
		plan, err := s.cache.LoadBackPlan(h)
		if err != nil {
			return err
		}
		*nPages = C.size_t(len(plan))
		if pages == nil {
			return nil
		}
		if uint64(len(plan)) > uint64(pagesCap) {
			return fmt.Errorf("%w: pages holds %d entries, the plan has %d (*n_pages)", errSize, pagesCap, len(plan))
		}
		for i, p := range plan {
			*(*C.int64_t)(unsafe.Add(unsafe.Pointer(pages), i*C.sizeof_int64_t)) = C.int64_t(p)
		}
		return nil
	})
}

//export cpcapi_load_back_slots
func cpcapi_load_back_slots(c C.cpcache_t, node C.cpcache_node_t, slots *C.int32_t, nSlots C.size_t, pages *C.int64_t,
	freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return nodeCall(c, node, "cpcache_load_back_slots", func(s *session, h hicache.Handle) error {
		own, err := slotList(slots, nSlots)
		if err != nil {
			return err
		}
		fo := freedSlots(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		res, err := s.cache.LoadBackSlots(h, own)
		if err != nil {
			return err
		}
		if pages != nil {
			*pages = C.int64_t(res.Pages)
		}
		s.handBack(res.Freed, fo)
		return nil
	})
}

//export cpcapi_evict_l1_slots
func cpcapi_evict_l1_slots(c C.cpcache_t, pages C.int64_t, freedPages, pending *C.int64_t, freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_evict_l1_slots", func(s *session) error {
		if err := nonNegative(pages, "pages"); err != nil {
			return err
		}
		fo := freedSlots(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		f, p, err := s.evictInto(int(pages), fo)
		if err != nil {
			return err
		}
		if freedPages != nil {
			*freedPages = C.int64_t(f)
		}
		if pending != nil {
			*pending = C.int64_t(p)
		}
		return nil
	})
}

//export cpcapi_take_freed_l1
func cpcapi_take_freed_l1(c C.cpcache_t, freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_take_freed_l1", func(s *session) error {
		fo := freedSlots(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		s.takeFreed(fo)
		return nil
	})
}

//export cpcapi_l1_used_by
func cpcapi_l1_used_by(c C.cpcache_t, cpRank C.int32_t, used *C.int64_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_l1_used_by", func(s *session) error {
		if used == nil {
			return fmt.Errorf("%w: used is NULL", errInvalid)
		}
		n, err := s.cache.L1UsedBy(int(cpRank))
		if err == nil {
			*used = C.int64_t(n)
		}
		return err
	})
}
