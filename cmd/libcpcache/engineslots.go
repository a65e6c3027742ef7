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

// freedBuf checks a freed-slot buffer and its count pointer before a call changes anything.
func freedBuf(freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) error {
	switch {
	case nFreed == nil:
		return fmt.Errorf("%w: n_freed is NULL", errInvalid)
	case freed == nil && freedCap != 0:
		return fmt.Errorf("%w: freed is NULL with freed_cap %d", errInvalid, freedCap)
	}
	return nil
}

// splitFreed splits freed slots into those a caller's buffer of capacity entries takes (the
// first ones) and those left to queue.
func splitFreed(slots []int32, capacity uint64) (give, keep []int32) {
	k := min(uint64(len(slots)), capacity)
	return slots[:k], slots[k:]
}

// handBack writes slots to the caller's buffer (freed, freedCap), sets *nFreed to their
// count and queues those past freedCap on the session.
func (s *session) handBack(slots []int32, freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) {
	*nFreed = C.size_t(len(slots))
	give, keep := splitFreed(slots, uint64(freedCap))
	if len(give) > 0 {
		copy(unsafe.Slice((*int32)(unsafe.Pointer(freed)), len(give)), give)
	}
	s.freed = append(s.freed, keep...)
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
		if err := freedBuf(freed, freedCap, nFreed); err != nil {
			return err
		}
		// The tree keeps the tokens of new nodes (Go memory); the core does not keep own.
		res, err := s.cache.InsertSlots(hicache.Request{Tokens: append([]int32(nil), toks...), Key: k}, own)
		if err != nil {
			return err
		}
		*out = C.cpcache_insert_result{node: C.cpcache_node_t(res.Last), pages: C.int64_t(res.Pages), backups: C.int64_t(res.Backups)}
		s.handBack(res.Freed, freed, freedCap, nFreed)
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
		if err := freedBuf(freed, freedCap, nFreed); err != nil {
			return err
		}
		res, err := s.cache.LoadBackSlots(h, own)
		if err != nil {
			return err
		}
		if pages != nil {
			*pages = C.int64_t(res.Pages)
		}
		s.handBack(res.Freed, freed, freedCap, nFreed)
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
		if err := freedBuf(freed, freedCap, nFreed); err != nil {
			return err
		}
		f, p, slots, err := s.cache.EvictL1Slots(int(pages))
		if err != nil {
			return err
		}
		if freedPages != nil {
			*freedPages = C.int64_t(f)
		}
		if pending != nil {
			*pending = C.int64_t(p)
		}
		s.handBack(slots, freed, freedCap, nFreed)
		return nil
	})
}

//export cpcapi_take_freed_l1
func cpcapi_take_freed_l1(c C.cpcache_t, freed *C.int32_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_take_freed_l1", func(s *session) error {
		if err := freedBuf(freed, freedCap, nFreed); err != nil {
			return err
		}
		queued := append(s.freed, s.cache.FreedL1()...)
		s.freed = nil
		s.handBack(queued, freed, freedCap, nFreed)
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
