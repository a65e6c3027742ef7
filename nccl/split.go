package nccl

/*
#include "nccl_api.h"
*/
import "C"

import (
	"context"
	"fmt"
)

// NoColor excludes a rank from every communicator a Split creates (NCCL_SPLIT_NOCOLOR).
const NoColor = -1

// Split creates sub-communicators: ranks passing the same color form one, ordered by key
// (then by rank). Every rank of c must call it. A rank passing NoColor gets nil. Needs NCCL
// >= 2.18 (ErrUnsupported otherwise).
//
// In non-blocking mode ncclCommSplit returns (ncclSuccess in 2.28, ncclInProgress in some
// versions) while the split still runs on an NCCL thread: it sets *newcomm to NULL, marks
// the PARENT in progress, and stores the child into *newcomm only when the split completes
// (init.cc: "*newcomm should be NCCL_COMM_NULL until comm split fully complete";
// ncclCommInitRankFunc ends with __atomic_store_n(job->newcomm, comm)). So Split passes a C
// out-slot, polls the parent until it is ready, and only then reads the child, which it polls
// in turn.
func (c *Comm) Split(ctx context.Context, color, key int) (*Comm, error) {
	comm, err := c.handle()
	if err != nil {
		return nil, err
	}
	if !c.lib.Supports("split") {
		return nil, fmt.Errorf("nccl: split needs NCCL >= 2.18, have %v: %w", c.lib.Version(), ErrUnsupported)
	}
	if color < NoColor {
		return nil, fmt.Errorf("nccl: split color %d must be >= 0 or NoColor", color)
	}
	own, err := Open()
	if err != nil {
		return nil, err
	}
	nb := C.int(0)
	if !c.nonBlocking {
		nb = 1
	}
	useCfg := C.int(0)
	if c.lib.Supports("config") {
		useCfg = 1
	}
	detail := fmt.Sprintf("rank %d of %d, color %d, key %d", c.rank, c.size, color, key)
	slot := C.cp_nccl_slot_new()
	if slot == nil {
		own.Close()
		return nil, fmt.Errorf("nccl: split (%s): out of memory", detail)
	}
	// Every path below has seen the split complete, or aborted the parent (which joins the
	// split job), before the slot is freed.
	defer C.cp_nccl_slot_free(slot)
	rc, err := onFreshThread(c.dev, func() C.int {
		return C.cp_ncclCommSplit(comm, C.int(color), C.int(key), slot, useCfg, nb)
	})
	if err == nil && Result(rc) != Success && Result(rc) != InProgress {
		err = check(rc, "ncclCommSplit", detail, comm)
	}
	if err == nil && c.nonBlocking {
		err = c.waitReady(ctx, comm, "ncclCommSplit", detail) // aborts the parent on failure
	}
	if err != nil {
		abortComm(c.dev, C.cp_nccl_slot_load(slot)) // a child an aborted split left behind
		own.Close()
		return nil, err
	}
	sub := C.cp_nccl_slot_load(slot)
	if sub == nil {
		own.Close()
		if color != NoColor {
			return nil, fmt.Errorf("nccl: ncclCommSplit (%s) completed without a communicator", detail)
		}
		return nil, nil
	}
	child := &Comm{lib: own, dev: c.dev, nonBlocking: c.nonBlocking, timeout: c.timeout, comm: sub}
	if child.nonBlocking {
		if err := child.waitReady(ctx, sub, "ncclCommSplit (child)", detail); err != nil {
			own.Close()
			return nil, err
		}
	}
	n, _, r, err := child.Query()
	if err != nil {
		child.Close()
		return nil, err
	}
	child.size, child.rank = n, r
	return child, nil
}
