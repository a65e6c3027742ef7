//go:build cpcache_bench

package main

/*
#include "../../csrc/cpcache_capi.h"
*/
import "C"

import (
	"context"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/hicache"
)

// cpcache_bench_go runs the workload of ctest/bench.c through the Go API (hicache.Cache) of
// the open cache, so that the benchmark compares both in one process, interleaved. Only in
// libraries built with the cpcache_bench tag (make bench-capi). out receives the total ns of
// insert, match and step, then the pages inserted and matched.
//
//export cpcache_bench_go
func cpcache_bench_go(c C.cpcache_t, first, iters C.int, pageTokens, pages C.int, out *C.double) (status C.int) {
	defer guard(&status)
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	s.mu.Unlock() // the loop below takes the cache's own lock, as a Go caller would
	ctx := context.Background()
	pt, np := int(pageTokens), int(pages)
	var tIns, tMatch, tStep time.Duration
	var inserted, matched int
	for i := int(first); i < int(first+iters); i++ {
		tokens := make([]int32, np*pt) // Insert keeps it: a fresh slice per call
		for k := range tokens {
			tokens[k] = int32(k + 1)
			if k >= np*pt/2 {
				tokens[k] = int32(i*1000003 + k + 1)
			}
		}
		t0 := time.Now()
		ins, err := s.cache.Insert(hicache.Request{Tokens: tokens})
		t1 := time.Now()
		if err != nil {
			return fail(err)
		}
		m, err := s.cache.Match(hicache.Request{Tokens: tokens})
		t2 := time.Now()
		if err != nil {
			return fail(err)
		}
		err = s.cache.Step(ctx)
		t3 := time.Now()
		if err != nil {
			return fail(err)
		}
		tIns, tMatch, tStep = tIns+t1.Sub(t0), tMatch+t2.Sub(t1), tStep+t3.Sub(t2)
		inserted, matched = inserted+len(ins.Fill), matched+m.DevicePages
		if _, _, err := s.cache.EvictL1(np / 2); err != nil {
			return fail(err)
		}
		if _, err := s.cache.EvictL2(np / 2); err != nil {
			return fail(err)
		}
		for s.cache.Pending() > 8 {
			if err := s.cache.Step(ctx); err != nil {
				return fail(err)
			}
		}
	}
	res := unsafe.Slice(out, 5)
	res[0], res[1], res[2] = C.double(tIns.Nanoseconds()), C.double(tMatch.Nanoseconds()), C.double(tStep.Nanoseconds())
	res[3], res[4] = C.double(inserted), C.double(matched)
	return C.CPCACHE_OK
}
