//go:build !cpcache_nonvml

package cuda

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// QueryTopology asks NVML (libnvidia-ml.so.1, loaded at run time by go-nvml) for the node's
// GPUs and links. Without the library it returns an error wrapping ErrNVMLUnavailable and
// never panics: every entry point is looked up before it is called.
func QueryTopology() (*Topology, error) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvmlInit: %s", ErrNVMLUnavailable, nvmlString(lib, ret))
	}
	defer lib.Shutdown()
	has := func(sym string) bool { return lib.Extensions().LookupSymbol(sym) == nil }
	t := &Topology{}
	if has("nvmlSystemGetDriverVersion") {
		if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
			t.DriverVersion = v
		}
	}
	for _, sym := range []string{"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"} {
		if !has(sym) {
			return nil, fmt.Errorf("%w: libnvidia-ml lacks %s", ErrNVMLUnavailable, sym)
		}
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("cuda: nvmlDeviceGetCount: %s", nvmlString(lib, ret))
	}
	devs := make([]nvml.Device, n)
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("cuda: nvmlDeviceGetHandleByIndex(%d): %s", i, nvmlString(lib, ret))
		}
		devs[i] = d
		g := GPUInfo{Index: i, NUMANode: -1}
		if has("nvmlDeviceGetName") {
			g.Name, _ = lib.DeviceGetName(d)
		}
		if has("nvmlDeviceGetUUID") {
			g.UUID, _ = lib.DeviceGetUUID(d)
		}
		if has("nvmlDeviceGetMemoryInfo") {
			if m, ret := lib.DeviceGetMemoryInfo(d); ret == nvml.SUCCESS {
				g.MemoryTotal, g.MemoryUsed = m.Total, m.Used
			}
		}
		if has("nvmlDeviceGetPciInfo") || has("nvmlDeviceGetPciInfo_v3") {
			if p, ret := lib.DeviceGetPciInfo(d); ret == nvml.SUCCESS {
				g.PCIBusID = NormalizeBusID(int8String(p.BusId[:]))
				g.NUMANode = NUMANode(g.PCIBusID)
			}
		}
		t.GPUs = append(t.GPUs, g)
	}
	t.Links = make([][]PeerLink, n)
	p2p := has("nvmlDeviceGetP2PStatus")
	anc := has("nvmlDeviceGetTopologyCommonAncestor")
	for i := range devs {
		t.Links[i] = make([]PeerLink, n)
		for j := range devs {
			if i == j {
				t.Links[i][j] = PeerLink{P2PRead: true, P2PWrite: true, Ancestor: "same"}
				continue
			}
			var l PeerLink
			if p2p {
				l.P2PRead = p2pOK(lib, devs[i], devs[j], nvml.P2P_CAPS_INDEX_READ)
				l.P2PWrite = p2pOK(lib, devs[i], devs[j], nvml.P2P_CAPS_INDEX_WRITE)
				l.NVLink = p2pOK(lib, devs[i], devs[j], nvml.P2P_CAPS_INDEX_NVLINK)
			}
			if anc {
				if lvl, ret := lib.DeviceGetTopologyCommonAncestor(devs[i], devs[j]); ret == nvml.SUCCESS {
					l.Ancestor = ancestorName(lvl)
				}
			}
			t.Links[i][j] = l
		}
	}
	return t, nil
}

func p2pOK(lib nvml.Interface, a, b nvml.Device, idx nvml.GpuP2PCapsIndex) bool {
	st, ret := lib.DeviceGetP2PStatus(a, b, idx)
	return ret == nvml.SUCCESS && st == nvml.P2P_STATUS_OK
}

func nvmlString(lib nvml.Interface, ret nvml.Return) string {
	if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
		return "libnvidia-ml.so.1 not found"
	}
	return fmt.Sprintf("%s (nvmlReturn %d)", lib.ErrorString(ret), int(ret))
}

func ancestorName(l nvml.GpuTopologyLevel) string {
	switch l {
	case nvml.TOPOLOGY_INTERNAL:
		return "board"
	case nvml.TOPOLOGY_SINGLE:
		return "switch"
	case nvml.TOPOLOGY_MULTIPLE:
		return "switches"
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return "host bridge"
	case nvml.TOPOLOGY_NODE:
		return "numa node"
	case nvml.TOPOLOGY_SYSTEM:
		return "system"
	}
	return fmt.Sprintf("level %d", int(l))
}

func int8String(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
