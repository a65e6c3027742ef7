package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestABISizes(t *testing.T) {
	ipcMem, ipcEvent, attrs, devptr := abiSizes()
	if ipcMem != 64 || ipcEvent != 64 || IPCHandleSize != 64 {
		t.Errorf("IPC handle sizes = %d/%d/%d, want 64 (CU_IPC_HANDLE_SIZE)", ipcMem, ipcEvent, IPCHandleSize)
	}
	if attrs != 24 {
		t.Errorf("sizeof(CUmemcpyAttributes) = %d, want 24", attrs)
	}
	if devptr != 8 {
		t.Errorf("sizeof(CUdeviceptr) = %d, want 8 (the _v2 ABI)", devptr)
	}
}

func TestSymbolTableUsesV2Names(t *testing.T) {
	have := map[string]Symbol{}
	for _, s := range symbols() {
		have[s.Name] = s
	}
	for _, name := range []string{"cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
		"cuMemcpyDtoDAsync_v2", "cuIpcOpenMemHandle_v2", "cuMemHostRegister_v2", "cuStreamDestroy_v2",
		"cuEventDestroy_v2", "cuDevicePrimaryCtxRelease_v2", "cuMemGetInfo_v2", "cuDeviceTotalMem_v2"} {
		s, ok := have[name]
		if !ok || s.Optional {
			t.Errorf("%s: present=%v optional=%v, want a required entry", name, ok, s.Optional)
		}
		if plain := strings.TrimSuffix(name, "_v2"); have[plain].Name != "" {
			t.Errorf("table has the old-ABI name %s next to %s", plain, name)
		}
	}
	for _, name := range []string{"cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2"} {
		if !have[name].Optional {
			t.Errorf("%s must be optional (CUDA >= 12.8 only)", name)
		}
	}
	if s := have["cuMemcpyBatchAsync"]; s.Since != "CUDA 12.8" {
		t.Errorf("cuMemcpyBatchAsync since %q, want CUDA 12.8", s.Since)
	}
}

func TestIPCHandleText(t *testing.T) {
	var h IPCMemHandle
	for i := range h {
		h[i] = byte(i * 7)
	}
	txt, err := h.MarshalText()
	if err != nil || len(txt) != 128 {
		t.Fatalf("MarshalText = %d digits, %v", len(txt), err)
	}
	var back IPCMemHandle
	if err := back.UnmarshalText(txt); err != nil || back != h {
		t.Fatalf("round trip: %v, equal=%v", err, back == h)
	}
	if err := back.UnmarshalText(txt[:10]); err == nil || !strings.Contains(err.Error(), "10 hex digits, want 128") {
		t.Errorf("short handle error = %v", err)
	}
	bad := []byte(strings.Repeat("zz", 64))
	var ev IPCEventHandle
	if err := ev.UnmarshalText(bad); err == nil || !strings.Contains(err.Error(), "ipc event handle") {
		t.Errorf("bad hex error = %v", err)
	}
}

func TestErrorFormatting(t *testing.T) {
	err := check(2, callMemAlloc, "device 0, 1024 bytes")
	want := "cuda: cuMemAlloc_v2 (device 0, 1024 bytes): failed [CUDA_ERROR_OUT_OF_MEMORY = 2]"
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if !errors.Is(err, ErrorOutOfMemory) || errors.Is(err, ErrorInvalidValue) {
		t.Errorf("errors.Is by CUresult is wrong for %v", err)
	}
	err = check(201|1<<30, callMemFree, "device 3")
	var ce *Error
	if !errors.As(err, &ce) || ce.Call != "cuCtxSetCurrent" || ce.Code != ErrorInvalidContext ||
		!strings.Contains(ce.Detail, "for cuMemFree_v2, device 3") {
		t.Errorf("context failure reported as %#v", err)
	}
	if err := check(1<<29, callMemAlloc, ""); !errors.Is(err, ErrNotLoaded) || !strings.Contains(err.Error(), "cuMemAlloc_v2") {
		t.Errorf("not-loaded error = %v", err)
	}
	if got := Result(12345).Name(); got != "CUresult(12345)" {
		t.Errorf("unknown result name = %q", got)
	}
	if got := ErrorNotReady.Error(); got != "cuda: CUDA_ERROR_NOT_READY (600)" {
		t.Errorf("Result.Error = %q", got)
	}
	if check(0, callMemAlloc, "") != nil {
		t.Errorf("CUDA_SUCCESS must be nil")
	}
}

func TestBusIDAndNUMA(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:19:00.0": "0000:19:00.0",
		"0000:3B:00.0":     "0000:3b:00.0",
		"1:3b:00.0":        "0001:3b:00.0",
		"00010000:19:00.0": "",
		"19:00.0":          "",
		"0000:zz:00.0":     "",
	} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
	root := t.TempDir()
	dev := filepath.Join(root, "0000:19:00.0")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "numa_node"), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := numaNodeAt(root, "00000000:19:00.0"); got != 1 {
		t.Errorf("numa node = %d, want 1", got)
	}
	if got := numaNodeAt(root, "0000:1a:00.0"); got != -1 {
		t.Errorf("numa node of absent device = %d, want -1", got)
	}
}

func TestVersionAndBounds(t *testing.T) {
	for v, want := range map[int]string{12080: "12.8", 13000: "13.0", 12020: "12.2", 11040: "11.4"} {
		if got := FormatVersion(v); got != want {
			t.Errorf("FormatVersion(%d) = %q, want %q", v, got, want)
		}
	}
	b := &DeviceBuffer{size: 100}
	if err := b.span(90, 10); err != nil {
		t.Errorf("in-range span: %v", err)
	}
	if err := b.span(95, 10); err == nil || !strings.Contains(err.Error(), "[95, 95+10) outside buffer of 100 bytes") {
		t.Errorf("out-of-range span error = %v", err)
	}
	if err := validBatch([]Copy1{{Size: 1}, {Size: 0}}); err == nil || !strings.Contains(err.Error(), "batch copy 1: size 0") {
		t.Errorf("validBatch error = %v", err)
	}
	if _, err := (&Device{}).NewEvent(EventInterprocess); err == nil || !strings.Contains(err.Error(), "EventDisableTiming") {
		t.Errorf("interprocess event without DisableTiming: %v", err)
	}
}

func TestNilAndClosedObjects(t *testing.T) {
	var (
		drv *Driver
		dev *Device
		buf *DeviceBuffer
		hb  *HostBuffer
		reg *HostRegistration
		st  *Stream
		ev  *Event
	)
	for _, c := range []interface{ Close() error }{drv, dev, buf, hb, reg, st, ev} {
		if err := c.Close(); err != nil {
			t.Errorf("%T(nil).Close() = %v", c, err)
		}
	}
	if _, err := drv.DeviceCount(); !errors.Is(err, ErrNotLoaded) {
		t.Errorf("nil driver DeviceCount = %v", err)
	}
	closed := &Device{ordinal: 2, closed: true}
	if _, err := closed.Alloc(8); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "device 2") {
		t.Errorf("alloc on closed device = %v", err)
	}
	if _, err := closed.Alloc(0); err == nil || !strings.Contains(err.Error(), "size 0 must be positive") {
		t.Errorf("alloc of 0 bytes = %v", err)
	}
	if err := closed.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}
