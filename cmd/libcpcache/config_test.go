package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/job"
	"github.com/cpcache/cpcache/parallel"
)

func goodConfig() openConfig {
	return openConfig{rank: -1, timeout: time.Minute, pageTokens: 16, pageBytes: 64, l1Pages: 8, l2Pages: 16}
}

// Every bad value is rejected before any rank talks to another, with a message naming it.
func TestCheckConfigRejectsBadValues(t *testing.T) {
	var buf [64]byte
	cases := []struct {
		name string
		edit func(*openConfig)
		want string
	}{
		{"negative world", func(c *openConfig) { c.layout.World = -1 }, "world -1"},
		{"rank below -1", func(c *openConfig) { c.rank = -2 }, "rank -2"},
		{"explicit rank without world", func(c *openConfig) { c.rank = 0 }, "needs an explicit world"},
		{"rank outside world", func(c *openConfig) { c.rank, c.layout.World = 4, 4 }, "rank 4 outside world size 4"},
		{"zero page tokens", func(c *openConfig) { c.pageTokens = 0 }, "page_tokens 0"},
		{"zero page bytes", func(c *openConfig) { c.pageBytes = 0 }, "page_bytes 0"},
		{"zero l1", func(c *openConfig) { c.l1Pages = 0 }, "l1_pages 0"},
		{"huge l2", func(c *openConfig) { c.l2Pages = 1 << 40 }, "l2_pages"},
		{"overflow", func(c *openConfig) { c.pageBytes, c.l2Pages = 1<<40, 1<<30 }, "overflows"},
		{"slab backend", func(c *openConfig) { c.slabKind = 9 }, "slab_backend 9"},
		{"l1 kind", func(c *openConfig) { c.l1Kind = 9 }, "l1_kind 9"},
		{"host l1 without base", func(c *openConfig) { c.l1Kind = l1Host }, "l1_base is NULL"},
		{"cuda ipc with host l1", func(c *openConfig) {
			c.slabKind, c.l1Kind, c.l1Base = slabCUDAIPC, l1Host, unsafe.Pointer(&buf)
		}, "need a device L1"},
		{"device l1 with unpinned host slabs", func(c *openConfig) {
			c.l1Kind, c.l1Base = l1Device, unsafe.Pointer(&buf)
		}, "needs pin_host = 1"},
		{"negative device with pinned slabs", func(c *openConfig) { c.pinHost, c.device = true, -1 }, "device -1"},
		{"negative device with a device L1", func(c *openConfig) {
			c.l1Kind, c.l1Base, c.pinHost, c.device = l1Device, unsafe.Pointer(&buf), true, -2
		}, "device -2"},
		{"policy", func(c *openConfig) { c.options.Policy = hicache.Policy(7) }, "policy 7"},
		{"l1 mode", func(c *openConfig) { c.l1ModeIn, c.options.L1Mode = 7, 7 }, "l1_mode 7"},
		// options.L1Mode is l1_mode's low byte: 257 must not pass as EngineOwned.
		{"l1 mode past a byte", func(c *openConfig) { c.l1ModeIn, c.options.L1Mode = 257, hicache.EngineOwned }, "l1_mode 257"},
		{"timeout", func(c *openConfig) { c.timeout = 0 }, "timeout_ms 0"},
		{"timeout past a Duration", func(c *openConfig) { c.timeout, c.timeoutMs = 0, math.MaxInt64 }, "timeout_ms 9223372036854775807 must be in 1.."},
	}
	good := goodConfig()
	if err := checkConfig(&good); err != nil {
		t.Fatalf("good config rejected: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := goodConfig()
			tc.edit(&c)
			err := checkConfig(&c)
			if !errors.Is(err, errInvalid) {
				t.Fatalf("err = %v, want errInvalid", err)
			}
			if got := err.Error(); !strings.Contains(got, tc.want) {
				t.Fatalf("err = %q, want it to name %q", got, tc.want)
			}
		})
	}
}

// Status codes follow the error's kind, whatever wraps it.
func TestStatusOfMapsErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{errInvalid, -1}, {errSize, -2}, {errRange, -3}, {errClosed, -4}, {hicache.ErrClosed, -4},
		{errAlreadyOpen, -5}, {hicache.ErrBadConfig, -6}, {hicache.ErrScope, -6}, {hicache.ErrStaleHandle, -7},
		{hicache.ErrL1Full, -8}, {hicache.ErrBusy, -9}, {&hicache.DivergedError{}, -10},
		{errInternal, -100}, {errors.New("copy failed"), -13},
		{hicache.ErrNotStarted, -14},
		{hicache.ErrUnsupported, -6}, // a stream wait for a layer on a host L1
		{parallel.ErrClosed, -4},     // a step whose group cpcache_close closed meanwhile
		// A start failure: the failing rank gets its own error's code (an I/O error here),
		// the others a failed peer.
		{&hicache.StartError{Rank: 1, Err: errors.New("cuda: cuMemcpyHtoD: CUDA error 700")}, -13},
		{&hicache.StartError{Rank: 1, Err: errInvalid}, -1},
		// A value the job judges where it starts (an L1 buffer the copy engine refuses).
		{&hicache.StartError{Rank: 1, Err: fmt.Errorf("making the copy engine: %w: kvmem: too small", job.ErrBadValue)}, -1},
		{&hicache.StartError{Rank: 1}, -11},
		// A rank without a loadable CUDA driver for a configuration that needs one.
		{&hicache.StartError{Rank: 1, Err: &cuda.LoadError{Pkg: "cuda", Reason: cuda.ErrLibraryNotFound}}, -6},
		{&hicache.StartError{Rank: 1, Err: &cuda.LoadError{Pkg: "cuda", Reason: cuda.ErrMissingSymbol}}, -6},
		{gloo.CheckStore(context.Background(), "ftp://h/x"), -6},       // a bad CPCACHE_STORE
		{fmt.Errorf("gloo: store in use: %w", gloo.ErrStoreInUse), -6}, // another job's rendezvous
	} {
		wrapped := tc.err
		if wrapped != nil {
			wrapped = errors.Join(errors.New("context"), tc.err)
		}
		if got := int(statusOf(wrapped)); got != tc.want {
			t.Errorf("statusOf(%v) = %d, want %d", wrapped, got, tc.want)
		}
	}
}

// TestCheckHostMemory: the pools this rank allocates must fit the memory available, so that
// a large l1_pages is an error, not a process the kernel kills.
func TestCheckHostMemory(t *testing.T) {
	c := goodConfig() // 8 L1 and 16 L2 pages of 64 bytes: 1536 bytes
	if err := checkHostMemory(&c, 1536, "test"); err != nil {
		t.Errorf("pools that fit: %v", err)
	}
	err := checkHostMemory(&c, 1535, "test")
	if !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), "l1_pages 8 and l2_pages 16 of page_bytes 64") {
		t.Errorf("pools one byte too large: %v, want errInvalid naming the sizes", err)
	}
	c.l1Pages, c.l2Pages, c.pageBytes = math.MaxInt32, math.MaxInt32, 1<<32 // each near MaxInt64
	if err := checkHostMemory(&c, math.MaxInt64, "test"); !errors.Is(err, errInvalid) {
		t.Errorf("pools whose sum overflows: %v, want errInvalid", err)
	}
	c = goodConfig()
	c.l1Kind, c.l1Base = l1Host, unsafe.Pointer(&c) // the engine's memory: not counted
	if err := checkHostMemory(&c, 1024, "test"); err != nil {
		t.Errorf("a host L1 of the caller's: %v", err)
	}
}
