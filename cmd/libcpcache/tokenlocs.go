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

// The token-level calls: an engine that indexes its KV by token location (SGLang's
// out_cache_loc) passes and gets per-token locations instead of page slots. Page slot s holds
// locations s*page_tokens .. s*page_tokens+page_tokens-1 of this rank's buffers (the
// token-slot layout); other CP ranks' tokens are -1. Documentation in include/cpcache.h.

// locList is the caller's int64 locations [0..n) in place (read only during the call).
func locList(p *C.int64_t, n C.size_t, what string) ([]int64, error) {
	switch {
	case n == 0:
		return nil, nil
	case p == nil:
		return nil, fmt.Errorf("%w: %s is NULL with n_%s = %d", errInvalid, what, what, n)
	case uint64(n) > maxTokens:
		return nil, fmt.Errorf("%w: %s length %d is more than %d", errInvalid, what, n, uint64(maxTokens))
	}
	return unsafe.Slice((*int64)(unsafe.Pointer(p)), n), nil
}

// pageSlot is the slot of the page whose locations start at locs[at]: the page's
// page_tokens locations must be page-aligned and contiguous (slot*pt .. slot*pt+pt-1). An
// error names the first bad entry and its value.
func pageSlot(locs []int64, at, pt int, what string) (int32, error) {
	first := locs[at]
	if first < 0 || first%int64(pt) != 0 || first/int64(pt) > 1<<31-1 {
		return 0, fmt.Errorf("%w: %s[%d] = %d does not start a page (a non-negative multiple of page_tokens %d)", errInvalid, what, at, first, pt)
	}
	for k := 1; k < pt; k++ {
		if locs[at+k] != first+int64(k) {
			return 0, fmt.Errorf("%w: %s[%d] = %d: a page's locations are contiguous, want %d (page starting at %s[%d] = %d)",
				errInvalid, what, at+k, locs[at+k], first+int64(k), what, at, first)
		}
	}
	return int32(first / int64(pt)), nil
}

// ownSlots is the slot of every whole page of n tokens this rank owns, in order, from the
// caller's per-token locations (entries of other ranks' pages and past the whole pages are
// not read).
func (s *session) ownSlots(locs []int64, n int, what string) ([]int32, error) {
	pt, cp, r := s.info.pageTokens, s.info.cpSize, s.info.cpRank
	pages := n / pt
	if len(locs) < pages*pt {
		return nil, fmt.Errorf("%w: %d %s for the %d tokens of %d whole pages", errInvalid, len(locs), what, pages*pt, pages)
	}
	own := make([]int32, 0, (pages+cp-1)/cp)
	for i := r; i < pages; i += cp {
		sl, err := pageSlot(locs, i*pt, pt, what)
		if err != nil {
			return nil, err
		}
		own = append(own, sl)
	}
	return own, nil
}

//export cpcapi_match_locs
func cpcapi_match_locs(c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, out *C.cpcache_match_result, locs *C.int64_t, locsCap C.size_t,
	slots *C.int32_t, slotsCap C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_match_locs", func(s *session) error {
		req, err := requestArg(key, keyLen, tokens, n)
		if err != nil {
			return err
		}
		if out == nil {
			return fmt.Errorf("%w: out is NULL", errInvalid)
		}
		pt := s.info.pageTokens
		whole := len(req.Tokens) / pt * pt
		if err := needCap(unsafe.Pointer(locs), uint64(locsCap), whole, "locs", whole == 0); err != nil {
			return err
		}
		if err := needCap(unsafe.Pointer(slots), uint64(slotsCap), whole/pt, "l1_slots", true); err != nil {
			return err
		}
		m, err := s.cache.Match(req)
		if err != nil {
			return err
		}
		if slots != nil && m.DevicePages > 0 {
			copy(unsafe.Slice((*int32)(unsafe.Pointer(slots)), m.DevicePages), m.L1Slots[:m.DevicePages])
		}
		if m.DevicePages > 0 {
			writeLocs(unsafe.Slice((*int64)(unsafe.Pointer(locs)), m.DevicePages*pt), m.L1Slots[:m.DevicePages], pt)
		}
		*out = C.cpcache_match_result{node: C.cpcache_node_t(m.Last), device_pages: C.int64_t(m.DevicePages), host_pages: C.int64_t(m.HostPages)}
		return nil
	})
}

// writeLocs writes the per-token locations of slots (-1 for a negative slot: another rank's
// page) to dst, page_tokens entries a slot.
func writeLocs(dst []int64, slots []int32, pt int) {
	for i, sl := range slots {
		row := dst[i*pt : (i+1)*pt]
		if sl < 0 {
			for j := range row {
				row[j] = -1
			}
			continue
		}
		base := int64(sl) * int64(pt)
		for j := range row {
			row[j] = base + int64(j)
		}
	}
}

//export cpcapi_insert_locs
func cpcapi_insert_locs(c C.cpcache_t, key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t, locs *C.int64_t, nLocs C.size_t,
	out *C.cpcache_insert_result, freed *C.int64_t, freedCap C.size_t, nFreed *C.size_t, kept *C.int64_t, keptCap C.size_t, nKept *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_insert_locs", func(s *session) error {
		req, err := requestArg(key, keyLen, tokens, n)
		if err != nil {
			return err
		}
		ls, err := locList(locs, nLocs, "locs")
		if err != nil {
			return err
		}
		if out == nil {
			return fmt.Errorf("%w: out is NULL", errInvalid)
		}
		fo := freedLocations(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		pt := s.info.pageTokens
		whole := len(req.Tokens) / pt * pt
		if kept != nil {
			if err := needCap(unsafe.Pointer(kept), uint64(keptCap), whole, "kept", false); err != nil {
				return err
			}
			if nKept == nil {
				return fmt.Errorf("%w: n_kept is NULL with kept", errInvalid)
			}
		}
		own, err := s.ownSlots(ls, len(req.Tokens), "locs")
		if err != nil {
			return err
		}
		// The C memory is read in place: the core copies the tokens of the nodes it creates
		// (Core.insertKey) and keeps neither req.Tokens nor own.
		res, err := s.cache.InsertSlots(req, own)
		if err != nil {
			return err
		}
		*out = C.cpcache_insert_result{node: C.cpcache_node_t(res.Last), pages: C.int64_t(res.Pages), backups: C.int64_t(res.Backups)}
		s.handBack(res.Freed, fo)
		if kept != nil {
			// The cache's locations of the sequence after the insert, as a match gives them
			// (the same match on every rank: replicated).
			m, err := s.cache.Match(req)
			if err != nil {
				return err
			}
			writeLocs(unsafe.Slice((*int64)(unsafe.Pointer(kept)), m.DevicePages*pt), m.L1Slots[:m.DevicePages], pt)
			*nKept = C.size_t(m.DevicePages * pt)
			out.node = C.cpcache_node_t(m.Last)
		}
		return nil
	})
}

//export cpcapi_load_back_locs
func cpcapi_load_back_locs(c C.cpcache_t, node C.cpcache_node_t, locs *C.int64_t, nLocs C.size_t, pages *C.int64_t,
	freed *C.int64_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return nodeCall(c, node, "cpcache_load_back_locs", func(s *session, h hicache.Handle) error {
		ls, err := locList(locs, nLocs, "locs")
		if err != nil {
			return err
		}
		fo := freedLocations(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		pt := s.info.pageTokens
		if len(ls)%pt != 0 {
			return fmt.Errorf("%w: %d locs is not whole pages of page_tokens %d", errInvalid, len(ls), pt)
		}
		own := make([]int32, len(ls)/pt)
		for j := range own {
			if own[j], err = pageSlot(ls, j*pt, pt, "locs"); err != nil {
				return err
			}
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

//export cpcapi_evict_locs
func cpcapi_evict_locs(c C.cpcache_t, tokens C.int64_t, freedTokens, pendingTokens *C.int64_t, freed *C.int64_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_evict_locs", func(s *session) error {
		if err := nonNegative(tokens, "tokens"); err != nil {
			return err
		}
		fo := freedLocations(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		pt := int64(s.info.pageTokens)
		f, p, err := s.evictInto(int((int64(tokens)+pt-1)/pt), fo)
		if err != nil {
			return err
		}
		if freedTokens != nil {
			*freedTokens = C.int64_t(int64(f) * pt)
		}
		if pendingTokens != nil {
			*pendingTokens = C.int64_t(int64(p) * pt)
		}
		return nil
	})
}

//export cpcapi_take_freed_locs
func cpcapi_take_freed_locs(c C.cpcache_t, freed *C.int64_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_take_freed_locs", func(s *session) error {
		fo := freedLocations(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		s.takeFreed(fo)
		return nil
	})
}

// roomDeficit is the pages the CP group must evict so that every rank r has room, beside
// the slots the cache holds (L1UsedBy) and reserved[r] held by the engine, for the pages it
// owns among sequence pages [lo, hi).
func (s *session) roomDeficit(lo, hi int, reserved []int64) (int, error) {
	cp, l1 := s.info.cpSize, s.info.l1Pages
	deficit := 0
	for r := 0; r < cp; r++ {
		used, err := s.cache.L1UsedBy(r)
		if err != nil {
			return 0, err
		}
		need := 0
		if first := lo + ((r-lo)%cp+cp)%cp; first < hi {
			need = (hi - first + cp - 1) / cp
		}
		res := 0
		if reserved != nil {
			res = int(reserved[r])
		}
		deficit += max(0, used+res+need-l1)
	}
	return deficit, nil
}

//export cpcapi_make_room
func cpcapi_make_room(c C.cpcache_t, start, end C.int64_t, reserved *C.int64_t, room *C.int32_t, freed *C.int64_t, freedCap C.size_t, nFreed *C.size_t) (status C.int) {
	defer guard(&status)
	return sessionCall(c, "cpcache_make_room", func(s *session) error {
		if err := nonNegative(start, "start"); err != nil {
			return err
		}
		if end < start || int64(end) > maxTokens {
			return fmt.Errorf("%w: end %d is not in [start %d, %d]", errInvalid, end, start, uint64(maxTokens))
		}
		if room == nil {
			return fmt.Errorf("%w: room is NULL", errInvalid)
		}
		fo := freedLocations(freed, freedCap, nFreed)
		if err := fo.check(); err != nil {
			return err
		}
		var res []int64
		if reserved != nil {
			res = unsafe.Slice((*int64)(unsafe.Pointer(reserved)), s.info.cpSize)
			for r, v := range res {
				if v < 0 {
					return fmt.Errorf("%w: reserved[%d] = %d is negative", errInvalid, r, v)
				}
			}
		}
		pt := int64(s.info.pageTokens)
		lo, hi := int(int64(start)/pt), int((int64(end)+pt-1)/pt)
		var slots []int32
		*room = 0
		for {
			deficit, err := s.roomDeficit(lo, hi, res)
			if err != nil {
				return err
			}
			if deficit == 0 {
				*room = 1
				break
			}
			f, _, got, err := s.cache.EvictL1Slots(deficit)
			if err != nil {
				s.freed = append(s.freed, slots...) // freed by earlier rounds: cpcache_take_freed_locs
				return err
			}
			slots = append(slots, got...)
			if f == 0 {
				break
			}
		}
		s.handBack(slots, fo)
		return nil
	})
}

// requestArg is the request of a call's isolation key (key, keyLen) and tokens (tokens, n),
// each checked as keyString and tokenSlice check them. Its tokens are the caller's memory.
func requestArg(key unsafe.Pointer, keyLen C.size_t, tokens *C.int32_t, n C.size_t) (hicache.Request, error) {
	k, err := keyString(key, uint64(keyLen))
	if err != nil {
		return hicache.Request{}, err
	}
	toks, err := tokenSlice(unsafe.Pointer(tokens), uint64(n), "tokens")
	if err != nil {
		return hicache.Request{}, err
	}
	return hicache.Request{Tokens: toks, Key: k}, nil
}
