package cuda

/*
#include "cuda_api.h"
*/
import "C"

import (
	"encoding/hex"
	"fmt"
	"unsafe"
)

// IPCMemHandle is a CUipcMemHandle: 64 opaque bytes that let another process on the same
// node map a device allocation. It is plain data: send it over any channel.
type IPCMemHandle [IPCHandleSize]byte

// IPCEventHandle is a CUipcEventHandle (64 bytes) for an EventInterprocess event.
type IPCEventHandle [IPCHandleSize]byte

// MarshalText encodes the handle as 128 lowercase hex digits.
func (h IPCMemHandle) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(h[:])), nil }

// UnmarshalText decodes 128 hex digits.
func (h *IPCMemHandle) UnmarshalText(b []byte) error { return unhex(h[:], b, "memory") }

// MarshalText encodes the handle as 128 lowercase hex digits.
func (h IPCEventHandle) MarshalText() ([]byte, error) { return []byte(hex.EncodeToString(h[:])), nil }

// UnmarshalText decodes 128 hex digits.
func (h *IPCEventHandle) UnmarshalText(b []byte) error { return unhex(h[:], b, "event") }

func unhex(dst, src []byte, kind string) error {
	if len(src) != 2*IPCHandleSize {
		return fmt.Errorf("cuda: ipc %s handle: %d hex digits, want %d", kind, len(src), 2*IPCHandleSize)
	}
	if _, err := hex.Decode(dst, src); err != nil {
		return fmt.Errorf("cuda: ipc %s handle %.16q...: %v", kind, src, err)
	}
	return nil
}

// IPCHandle exports the allocation for OpenIPC in another process. The handle stays valid
// while this buffer is open; the exporting process must keep it open until every importer
// has closed its mapping.
func (b *DeviceBuffer) IPCHandle() (IPCMemHandle, error) {
	var h IPCMemHandle
	if err := b.live(); err != nil {
		return h, err
	}
	if b.opened {
		return h, fmt.Errorf("cuda: buffer %v was opened from an IPC handle; only the owner exports it", b.ptr)
	}
	err := check(C.cp_cuIpcGetMemHandle(b.dev.ctx, unsafe.Pointer(&h[0]), C.cp_CUdeviceptr(b.ptr)), callIpcGetMem, b.dev.detail())
	return h, err
}

// OpenIPC maps an allocation exported by another process (on this device, or a peer device
// with P2P access). size is the exporter's buffer size (IPC handles do not carry it); Close
// unmaps it. A process cannot open its own handles (the driver refuses).
func (d *Device) OpenIPC(h IPCMemHandle, size int) (*DeviceBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("cuda: open ipc: size %d must be positive", size)
	}
	if err := d.live(); err != nil {
		return nil, err
	}
	var p C.cp_CUdeviceptr
	if err := check(C.cp_cuIpcOpenMemHandle(d.ctx, &p, unsafe.Pointer(&h[0]), C.CP_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
		callIpcOpenMem, d.detail()); err != nil {
		return nil, err
	}
	return &DeviceBuffer{dev: d, ptr: DevicePtr(p), size: size, opened: true}, nil
}
