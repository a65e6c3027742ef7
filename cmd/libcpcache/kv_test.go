package main

import (
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/cpcache/cpcache/hicache/kvmem"
	"github.com/cpcache/cpcache/job"
)

// kvTestConfig is one rank of a world of 1 with a 2-layer K/V layout of 16 bytes a token per
// part (256 bytes a page of 4 tokens) and page_bytes 0 (the layout's).
func kvTestConfig() openConfig {
	c := goodConfig()
	c.layout.World, c.rank, c.pageTokens, c.pageBytes = 1, 0, 4, 0
	c.kv.kvSpec = "layers=2;k=16:sharded;v=16:sharded"
	return c
}

// tokenSlotBuffers are host token-slot buffers of slots slots for every (layer, part) of
// kvTestConfig's layout, in memory the test keeps.
func tokenSlotBuffers(slots int) []l1BufferDesc {
	var bufs []l1BufferDesc
	for l := range 2 {
		for j := range 2 {
			mem := make([]byte, slots*4*16)
			bufs = append(bufs, l1BufferDesc{layer: int32(l), part: int32(j), kind: memHost, base: unsafe.Pointer(unsafe.SliceData(mem)),
				bytes: int64(len(mem)), pageStride: 4 * 16, tokenStride: 16})
		}
	}
	return bufs
}

// deviceKinds marks bufs as device memory (CPCACHE_MEM_DEVICE): resolveKV only reads their
// addresses, so host memory stands in for the device's here.
func deviceKinds(bufs []l1BufferDesc) []l1BufferDesc {
	for i := range bufs {
		bufs[i].kind = memDevice
	}
	return bufs
}

// TestResolveKVTakesDeviceBuffers: CPCACHE_MEM_DEVICE buffers with l1_kind CPCACHE_L1_DEVICE,
// l1_base NULL and pinned host slabs (or CUDA IPC slabs) become kvmem device buffers at their
// addresses, and the job's L1 is the device one (the CUDA engine's per-layer copies).
func TestResolveKVTakesDeviceBuffers(t *testing.T) {
	for _, slabs := range []int{slabHost, slabCUDAIPC} {
		c := kvTestConfig()
		c.kv.l1Buffers, c.l1Kind, c.slabKind, c.pinHost = deviceKinds(tokenSlotBuffers(c.l1Pages)), l1Device, slabs, slabs == slabHost
		if err := checkConfig(&c); err != nil {
			t.Fatalf("slab backend %d: %v", slabs, err)
		}
		if !c.kv.device || len(c.kv.kvBufs) != 4 || c.pageBytes != 256 {
			t.Fatalf("slab backend %d: device %v, %d buffers, page bytes %d; want true, 4, 256", slabs, c.kv.device, len(c.kv.kvBufs), c.pageBytes)
		}
		for i, b := range c.kv.kvBufs {
			if b.Host != nil || b.Device != uintptr(c.kv.l1Buffers[i].base) || b.Bytes != c.kv.l1Buffers[i].bytes {
				t.Fatalf("buffer %d: host %v, device %#x, %d bytes; want the caller's device address %p and %d bytes",
					i, b.Host != nil, b.Device, b.Bytes, c.kv.l1Buffers[i].base, c.kv.l1Buffers[i].bytes)
			}
		}
		jc := jobConfig(&c)
		if jc.L1 != job.L1Device || len(jc.L1Buffers) != 4 || jc.L1Base != nil {
			t.Fatalf("slab backend %d: job L1 kind %d, %d buffers, base %p; want L1Device, 4, nil", slabs, jc.L1, len(jc.L1Buffers), jc.L1Base)
		}
	}
}

func TestResolveKVTakesThePageBytesAndBuildsTheL1(t *testing.T) {
	c := kvTestConfig()
	c.kv.l1Buffers = tokenSlotBuffers(c.l1Pages)
	c.kv.l2LayoutIn = int(kvmem.LayerFirst)
	if err := checkConfig(&c); err != nil {
		t.Fatal(err)
	}
	if c.pageBytes != 256 || c.kv.kvLayout == nil || len(c.kv.kvBufs) != 4 || c.kv.l2Layout != kvmem.LayerFirst {
		t.Fatalf("page bytes %d, layout %v, %d buffers, L2 %v; want 256, a layout, 4, layer_first", c.pageBytes, c.kv.kvLayout, len(c.kv.kvBufs), c.kv.l2Layout)
	}
	if perToken, perPage, ok := kvSizes(&c, 1); !ok || perToken != 64 || perPage != 256 {
		t.Fatalf("kvSizes = %d, %d, %v; want 64, 256, true", perToken, perPage, ok)
	}
	jc := jobConfig(&c)
	if jc.KVLayout == nil || len(jc.L1Buffers) != 4 || jc.L2Layout != kvmem.LayerFirst || jc.L1 != 0 {
		t.Fatalf("job config: layout %v, %d buffers, L2 %v, L1 kind %d", jc.KVLayout, len(jc.L1Buffers), jc.L2Layout, jc.L1)
	}
	// A preset by name, and the same layout as parts.
	c = kvTestConfig()
	c.kv.kvSpec, c.kv.kvLayers = "", 2
	c.kv.kvParts = []kvPartDesc{{name: "k", bytesPerToken: 16, sharding: 1}, {name: "v", bytesPerToken: 16, sharding: 1}}
	if err := checkConfig(&c); err != nil || c.pageBytes != 256 {
		t.Fatalf("parts: %v, page bytes %d", err, c.pageBytes)
	}
	c = kvTestConfig()
	c.kv.kvSpec = "llama-3-8b"
	if err := checkConfig(&c); err != nil || c.pageBytes != 4*128*1024 {
		t.Fatalf("preset: %v, page bytes %d (want 512 KiB: 128 KiB a token × 4)", err, c.pageBytes)
	}
}

func TestResolveKVRejectsBadDescriptionsNamingThem(t *testing.T) {
	cases := []struct {
		name string
		edit func(*openConfig)
		want string
	}{
		{"unknown preset", func(c *openConfig) { c.kv.kvSpec = "no-such-model" }, `kv_layout "no-such-model"`},
		{"page bytes differ", func(c *openConfig) { c.pageBytes = 64 }, "page_bytes 64, but the KV layout"},
		{"spec and parts", func(c *openConfig) { c.kv.kvParts = []kvPartDesc{{name: "k", bytesPerToken: 1, sharding: 1}} }, "both set"},
		{"bad sharding", func(c *openConfig) {
			c.kv.kvSpec, c.kv.kvLayers = "", 2
			c.kv.kvParts = []kvPartDesc{{name: "k", bytesPerToken: 16, sharding: 1}, {name: "v", bytesPerToken: 16, sharding: 3}}
		}, `kv_parts[1] ("v"): sharding 3`},
		{"duplicate part", func(c *openConfig) {
			c.kv.kvSpec, c.kv.kvLayers = "", 2
			c.kv.kvParts = []kvPartDesc{{name: "k", bytesPerToken: 16, sharding: 1}, {name: "k", bytesPerToken: 16, sharding: 1}}
		}, `"k"`},
		{"layers without parts", func(c *openConfig) { c.kv.kvSpec, c.kv.kvLayers = "", 3 }, "kv_num_layers 3 without kv_parts"},
		{"bad counts", func(c *openConfig) { c.kv.badCounts = true }, "kv_num_parts and l1_num_buffers"},
		{"l2 layout", func(c *openConfig) { c.kv.l2LayoutIn = 7 }, "l2_layout 7"},
		{"layer first without layout", func(c *openConfig) { c.kv.kvSpec, c.kv.l2LayoutIn, c.pageBytes = "", 2, 64 }, "layer_first needs a KV layout"},
		{"buffers without layout", func(c *openConfig) { c.kv.kvSpec, c.pageBytes, c.kv.l1Buffers = "", 64, tokenSlotBuffers(8) }, "need a KV layout"},
		{"buffers with a pool", func(c *openConfig) { c.kv.l1Buffers, c.l1Kind = tokenSlotBuffers(8), l1Host }, "l1_kind must be CPCACHE_L1_ALLOC"},
		{"mixed host and device buffers", func(c *openConfig) { c.kv.l1Buffers = tokenSlotBuffers(8); c.kv.l1Buffers[2].kind = memDevice },
			"l1_buffers[2] (layer 1, part 0): CPCACHE_MEM_DEVICE, but l1_buffers[0] (layer 0, part 0) is CPCACHE_MEM_HOST"},
		{"mixed device and host buffers", func(c *openConfig) {
			c.kv.l1Buffers, c.l1Kind, c.pinHost = deviceKinds(tokenSlotBuffers(8)), l1Device, true
			c.kv.l1Buffers[3].kind = memHost
		}, "l1_buffers[3] (layer 1, part 1): CPCACHE_MEM_HOST, but l1_buffers[0] (layer 0, part 0) is CPCACHE_MEM_DEVICE"},
		{"bad buffer kind", func(c *openConfig) { c.kv.l1Buffers = tokenSlotBuffers(8); c.kv.l1Buffers[1].kind = 3 }, "l1_buffers[1] (layer 0, part 1): kind 3"},
		{"device buffers with the alloc L1 kind", func(c *openConfig) { c.kv.l1Buffers = deviceKinds(tokenSlotBuffers(8)) },
			"l1_buffers[0] (layer 0, part 0): device buffers (CPCACHE_MEM_DEVICE) need l1_kind CPCACHE_L1_DEVICE and l1_base NULL (got l1_kind 0)"},
		{"device buffers with a host L1 kind", func(c *openConfig) {
			c.kv.l1Buffers, c.l1Kind, c.l1Base = deviceKinds(tokenSlotBuffers(8)), l1Host, unsafe.Pointer(c)
		}, "l1_buffers[0] (layer 0, part 0): device buffers (CPCACHE_MEM_DEVICE) need l1_kind CPCACHE_L1_DEVICE and l1_base NULL (got l1_kind 1)"},
		{"device buffers and a device pool", func(c *openConfig) {
			c.kv.l1Buffers, c.l1Kind, c.l1Base, c.pinHost = deviceKinds(tokenSlotBuffers(8)), l1Device, unsafe.Pointer(c), true
		}, "need l1_kind CPCACHE_L1_DEVICE and l1_base NULL (got l1_kind 2)"},
		{"host buffers with a device L1 kind", func(c *openConfig) { c.kv.l1Buffers, c.l1Kind, c.pinHost = tokenSlotBuffers(8), l1Device, true },
			"with host buffers (l1_buffers[0] (layer 0, part 0) is CPCACHE_MEM_HOST) l1_kind must be CPCACHE_L1_ALLOC"},
		{"device buffers with unpinned host slabs", func(c *openConfig) { c.kv.l1Buffers, c.l1Kind = deviceKinds(tokenSlotBuffers(8)), l1Device },
			"a device L1 with host slabs needs pin_host = 1"},
		{"device buffers on a negative device", func(c *openConfig) {
			c.kv.l1Buffers, c.l1Kind, c.pinHost, c.device = deviceKinds(tokenSlotBuffers(8)), l1Device, true, -1
		}, "device -1 is negative"},
		{"device buffer too small", func(c *openConfig) {
			c.kv.l1Buffers, c.l1Kind, c.pinHost = deviceKinds(tokenSlotBuffers(8)), l1Device, true
			c.kv.l1Buffers[2].bytes -= 16
		}, "layer 1 part 0"},
		{"null base", func(c *openConfig) { c.kv.l1Buffers = tokenSlotBuffers(8); c.kv.l1Buffers[3].base = nil }, "l1_buffers[3] (layer 1, part 1): base is NULL"},
		{"too small", func(c *openConfig) { c.kv.l1Buffers = tokenSlotBuffers(8); c.kv.l1Buffers[3].bytes -= 16 }, "layer 1"},
		{"missing part", func(c *openConfig) { c.kv.l1Buffers = tokenSlotBuffers(8)[:3] }, "layer 1"},
		{"overlap", func(c *openConfig) {
			c.kv.l1Buffers = tokenSlotBuffers(8)
			c.kv.l1Buffers[1].base = c.kv.l1Buffers[0].base
		}, "overlap"},
		// A row of 32 bytes over a part of 16 would be half cached: refused naming both sizes.
		{"rows wider than the part", func(c *openConfig) {
			c.kv.l1Buffers = tokenSlotBuffers(8)
			for i := range c.kv.l1Buffers {
				c.kv.l1Buffers[i].tokenBytes = 16
			}
			c.kv.l1Buffers[3].tokenBytes = 32
		}, `l1_buffers[3]: layer 1 part 1 ("v"): the buffer's rows are 32 bytes a token, the part's bytes per token on this rank are 16`},
		{"negative token bytes", func(c *openConfig) { c.kv.l1Buffers = tokenSlotBuffers(8); c.kv.l1Buffers[1].tokenBytes = -1 },
			"l1_buffers[1] (layer 0, part 1): token_bytes -1 is negative"},
		{"invalid layout, no page bytes", func(c *openConfig) { c.layout.World, c.layout.TP, c.rank = 3, 2, 0 }, "page_bytes 0 with a KV layout needs the attention-TP size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := kvTestConfig()
			tc.edit(&c)
			err := checkConfig(&c)
			if !errors.Is(err, errInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("checkConfig = %v; want errInvalid naming %q", err, tc.want)
			}
		})
	}
}

// TestBadBuffersUnderTheLaunchersWorldAreInvalidBeforeOpen: under a launcher's world (world
// 0, rank -1, the world size in the environment) a bad l1_buffers description is refused by
// checkConfig, before any rank talks to another, with CPCACHE_ERR_INVALID and the same
// message as under an explicit world of that size; and page_bytes 0 takes the layout's
// bytes of a page there as it does with an explicit world. (The job used to check the
// buffers after the rendezvous, where the failure came back as CPCACHE_ERR_IO on the rank
// that had it and CPCACHE_ERR_PEER_LOST on the others.)
func TestBadBuffersUnderTheLaunchersWorldAreInvalidBeforeOpen(t *testing.T) {
	for _, v := range []string{"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"} {
		name, value, _ := strings.Cut(v, "=")
		t.Setenv(name, value)
	}
	// Two ranks of attention-TP 2: 8 bytes of each part a token on each rank, 128 bytes a page.
	buffers := func(slots int) []l1BufferDesc {
		bufs := tokenSlotBuffers(slots)
		for i := range bufs {
			bufs[i].bytes /= 2
			bufs[i].pageStride /= 2
			bufs[i].tokenStride /= 2
		}
		return bufs
	}
	cases := []struct {
		name string
		edit func([]l1BufferDesc) []l1BufferDesc
		want string
	}{
		{"too small", func(b []l1BufferDesc) []l1BufferDesc { b[3].bytes -= 8; return b }, `layer 1 part 1 ("v")`},
		{"missing part", func(b []l1BufferDesc) []l1BufferDesc { return b[:3] }, "layer 1 part 1"},
		{"overlap", func(b []l1BufferDesc) []l1BufferDesc { b[1].base = b[0].base; return b }, "overlap"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var errs [2]error
			for i, world := range []int{2, 0} { // explicit, the launcher's
				c := kvTestConfig()
				c.layout.World, c.rank, c.pageBytes = world, -1, 128
				if world > 0 {
					c.rank = 1
				}
				c.kv.l1Buffers = tc.edit(buffers(8))
				errs[i] = checkConfig(&c)
				if !errors.Is(errs[i], errInvalid) || !strings.Contains(errs[i].Error(), tc.want) {
					t.Fatalf("world %d: checkConfig = %v; want errInvalid naming %q", world, errs[i], tc.want)
				}
			}
			if errs[0].Error() != errs[1].Error() {
				t.Errorf("explicit world: %v\nlauncher's world: %v\nwant the same message", errs[0], errs[1])
			}
		})
	}
	c := kvTestConfig()
	c.layout.World, c.rank = 0, -1
	c.kv.l1Buffers = buffers(8)
	if err := checkConfig(&c); err != nil {
		t.Fatalf("good buffers under the launcher's world: %v", err)
	}
	if c.pageBytes != 128 || c.kv.attnTP != 2 {
		t.Errorf("page_bytes %d at attention-TP %d, want the layout's 128 at 2", c.pageBytes, c.kv.attnTP)
	}
}
