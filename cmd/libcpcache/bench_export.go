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

// cpcache_bench_step_go runs one round of python/bench_step.py's scheduler-step workload
// through the Go API of the open cache (engine-owned L1): steps scheduler steps over reqs
// running requests whose prompts have promptTokens tokens and grow by one page a step; each
// step matches every request's tokens, inserts them with their slots (request r's page i in
// slot r*(promptTokens/page_tokens+steps)+i) and steps. The first token of each request is
// 1000000+round*1000+r, the rest k, as the Python side builds them. Untimed afterwards: every
// page leaves L1 and L2, so that the next round starts empty. out: ns of the matches, the
// inserts, the steps.
//
//export cpcache_bench_step_go
func cpcache_bench_step_go(c C.cpcache_t, round, reqs, promptTokens, steps C.int, out *C.double) (status C.int) {
	defer guard(&status)
	s, err := use(uint64(c))
	if err != nil {
		return fail(err)
	}
	s.mu.Unlock()
	ctx := context.Background()
	pt := s.info.pageTokens
	perReq := int(promptTokens)/pt + int(steps)
	toks := make([][]int32, reqs)
	slots := make([][]int32, reqs)
	for r := range toks {
		toks[r] = make([]int32, perReq*pt)
		for k := range toks[r] {
			toks[r][k] = int32(k)
		}
		toks[r][0] = int32(1000000 + int(round)*1000 + r)
		slots[r] = make([]int32, perReq)
		for i := range slots[r] {
			slots[r][i] = int32(r*perReq + i)
		}
	}
	var tMatch, tIns, tStep time.Duration
	for st := 0; st < int(steps); st++ {
		n := int(promptTokens) + st*pt
		for r := range toks {
			t0 := time.Now()
			if _, err := s.cache.Match(hicache.Request{Tokens: toks[r][:n]}); err != nil {
				return fail(err)
			}
			t1 := time.Now()
			if _, err := s.cache.InsertSlots(hicache.Request{Tokens: toks[r][:n]}, slots[r][:n/pt]); err != nil {
				return fail(err)
			}
			t2 := time.Now()
			tMatch, tIns = tMatch+t1.Sub(t0), tIns+t2.Sub(t1)
		}
		t0 := time.Now()
		if err := s.cache.Step(ctx); err != nil {
			return fail(err)
		}
		tStep += time.Since(t0)
	}
	for s.cache.Pending() > 0 {
		if err := s.cache.Step(ctx); err != nil {
			return fail(err)
		}
	}
	if _, _, _, err := s.cache.EvictL1Slots(1 << 30); err != nil {
		return fail(err)
	}
	if _, err := s.cache.EvictL2(1 << 30); err != nil {
		return fail(err)
	}
	s.cache.FreedL1()
	res := unsafe.Slice(out, 3)
	res[0], res[1], res[2] = C.double(tMatch.Nanoseconds()), C.double(tIns.Nanoseconds()), C.double(tStep.Nanoseconds())
	return C.CPCACHE_OK
}
