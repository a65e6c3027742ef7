package cuda

/*
#include "cuda_api.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unsafe"
)

// DeviceAttribute is a CUdevice_attribute value (an ABI fact of cuda.h).
type DeviceAttribute int

// Attributes this package uses.
const (
	AttrMultiprocessorCount               DeviceAttribute = 16
	AttrPCIBusID                          DeviceAttribute = 33
	AttrPCIDeviceID                       DeviceAttribute = 34
	AttrUnifiedAddressing                 DeviceAttribute = 41
	AttrPCIDomainID                       DeviceAttribute = 50
	AttrComputeCapabilityMajor            DeviceAttribute = 75
	AttrComputeCapabilityMinor            DeviceAttribute = 76
	AttrCanUseHostPointerForRegisteredMem DeviceAttribute = 91
	AttrHostRegisterSupported             DeviceAttribute = 99
)

// Device is one CUDA device with its primary context retained. Every call through a Device
// (and through the buffers, streams and events made from it) makes that primary context
// current on the calling OS thread inside the same C call, so goroutines may move between
// threads freely and no runtime.LockOSThread is needed. Close it after everything made from it.
type Device struct {
	drv     *Driver
	ordinal int
	dev     C.int
	ctx     unsafe.Pointer // CUcontext of the retained primary context

	mu     sync.Mutex // protects closed
	closed bool
}

// Device retains the primary context of device ordinal (0 <= ordinal < DeviceCount).
func (d *Driver) Device(ordinal int) (*Device, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: device ordinal %d out of range [0, %d)", ordinal, n)
	}
	var dev C.int
	if err := check(C.cp_cuDeviceGet(&dev, C.int(ordinal)), callDeviceGet, fmt.Sprintf("ordinal %d", ordinal)); err != nil {
		return nil, err
	}
	var ctx unsafe.Pointer
	if err := check(C.cp_cuDevicePrimaryCtxRetain(&ctx, dev), callCtxRetain, fmt.Sprintf("device %d", ordinal)); err != nil {
		return nil, err
	}
	return &Device{drv: d, ordinal: ordinal, dev: dev, ctx: ctx}, nil
}

// Close releases the primary context. It is nil-safe and idempotent.
func (d *Device) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	return check(C.cp_cuDevicePrimaryCtxRelease(d.dev), callCtxRelease, d.detail())
}

func (d *Device) live() error {
	if d == nil {
		return fmt.Errorf("cuda: nil device: %w", ErrClosed)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("cuda: device %d: %w", d.ordinal, ErrClosed)
	}
	return nil
}

func (d *Device) detail() string { return "device " + strconv.Itoa(d.ordinal) }

// Ordinal is the device's index in this process's device list.
func (d *Device) Ordinal() int { return d.ordinal }

// Driver is the driver this device was opened from.
func (d *Device) Driver() *Driver { return d.drv }

// Context returns the raw CUcontext of the retained primary context, for interoperation with
// other CUDA libraries (e.g. NCCL). It stays valid until Close.
func (d *Device) Context() uintptr { return uintptr(d.ctx) }

// MakeCurrent makes the device's primary context current on the calling OS thread. Only
// useful to code that then calls other CUDA libraries on the same thread: the caller must
// hold runtime.LockOSThread across MakeCurrent and those calls.
func (d *Device) MakeCurrent() error {
	if err := d.live(); err != nil {
		return err
	}
	if rc := C.cp_cuCtxSetCurrent(d.ctx); rc != 0 {
		return check(rc, callCtxSetCurrent, d.detail())
	}
	return nil
}

// Name is the device's marketing name, e.g. "NVIDIA H200".
func (d *Device) Name() (string, error) {
	if err := d.live(); err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	if err := check(C.cp_cuDeviceGetName((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)), d.dev), callDeviceName, d.detail()); err != nil {
		return "", err
	}
	return cstr(buf), nil
}

// TotalMem is the device's memory size in bytes.
func (d *Device) TotalMem() (uint64, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	var n C.size_t
	if err := check(C.cp_cuDeviceTotalMem(&n, d.dev), callTotalMem, d.detail()); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// MemInfo returns free and total device memory in bytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.live(); err != nil {
		return 0, 0, err
	}
	var f, t C.size_t
	if err := check(C.cp_cuMemGetInfo(d.ctx, &f, &t), callMemGetInfo, d.detail()); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// Attribute returns a CUdevice_attribute value.
func (d *Device) Attribute(a DeviceAttribute) (int, error) {
	if err := d.live(); err != nil {
		return 0, err
	}
	var v C.int
	if err := check(C.cp_cuDeviceGetAttribute(&v, C.int(a), d.dev), callAttribute, fmt.Sprintf("%s, attribute %d", d.detail(), int(a))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// ComputeCapability returns the SM version, e.g. (9, 0) for Hopper.
func (d *Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	minor, err = d.Attribute(AttrComputeCapabilityMinor)
	return major, minor, err
}

// PCIBusID is the device's PCI address as the driver formats it, e.g. "0000:19:00.0".
func (d *Device) PCIBusID() (string, error) {
	if err := d.live(); err != nil {
		return "", err
	}
	buf := make([]byte, 64)
	if err := check(C.cp_cuDeviceGetPCIBusId((*C.char)(unsafe.Pointer(&buf[0])), C.int(len(buf)), d.dev), callPCIBusID, d.detail()); err != nil {
		return "", err
	}
	return cstr(buf), nil
}

// Synchronize waits for all work on the device's primary context.
func (d *Device) Synchronize() error {
	if err := d.live(); err != nil {
		return err
	}
	return check(C.cp_cuCtxSynchronize(d.ctx), callCtxSync, d.detail())
}

// NUMANode returns the NUMA node of the PCI device at busID (any case; a 4- or 8-digit
// domain), read from sysfs; -1 when the platform does not say.
func NUMANode(busID string) int {
	return numaNodeAt("/sys/bus/pci/devices", busID)
}

func numaNodeAt(root, busID string) int {
	id := NormalizeBusID(busID)
	if id == "" {
		return -1
	}
	b, err := os.ReadFile(filepath.Join(root, id, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

// NormalizeBusID turns "00000000:19:00.0" (NVML) or "0000:19:00.0" (CUDA) into the sysfs form
// "0000:19:00.0"; "" when busID is not of that shape.
func NormalizeBusID(busID string) string {
	s := strings.ToLower(strings.TrimSpace(busID))
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return ""
	}
	dom := parts[0]
	if len(dom) > 4 {
		if strings.TrimLeft(dom[:len(dom)-4], "0") != "" {
			return ""
		}
		dom = dom[len(dom)-4:]
	}
	for len(dom) < 4 {
		dom = "0" + dom
	}
	for _, p := range []string{dom, parts[1], strings.Replace(parts[2], ".", "", 1)} {
		if _, err := strconv.ParseUint(p, 16, 64); err != nil {
			return ""
		}
	}
	return dom + ":" + parts[1] + ":" + parts[2]
}
