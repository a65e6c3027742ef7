package cuda

import (
	"errors"
	"fmt"
)

// GPUInfo describes one GPU as NVML sees it (all GPUs of the node, whatever
// CUDA_VISIBLE_DEVICES says; match CUDA devices by PCIBusID).
type GPUInfo struct {
	Index       int    // NVML index
	Name        string // "NVIDIA H200"
	UUID        string
	PCIBusID    string // sysfs form, "0000:19:00.0"
	NUMANode    int    // -1 when unknown
	MemoryTotal uint64 // bytes
	MemoryUsed  uint64 // bytes
}

// PeerLink is what NVML reports between two GPUs.
type PeerLink struct {
	P2PRead, P2PWrite bool   // peer reads/writes supported
	NVLink            bool   // P2P over NVLink
	Ancestor          string // closest common ancestor: "same", "board", "switch", "bridge", "host bridge", "numa node", "system"
}

// Topology is the node's GPUs and their pairwise links, from NVML.
type Topology struct {
	DriverVersion string       // kernel driver, e.g. "570.124.06"
	GPUs          []GPUInfo    // by NVML index
	Links         [][]PeerLink // Links[i][j] for i != j
}

// ErrNVMLUnavailable: libnvidia-ml could not be loaded or initialised (no driver).
var ErrNVMLUnavailable = errors.New("cuda: nvml unavailable")

// Index returns the NVML index of the GPU at PCI address busID, or -1.
func (t *Topology) Index(busID string) int {
	id := NormalizeBusID(busID)
	for _, g := range t.GPUs {
		if id != "" && g.PCIBusID == id {
			return g.Index
		}
	}
	return -1
}

// CanShareDeviceMemory reports whether a process on the GPU at busA can map (CUDA IPC) and
// access device memory of the GPU at busB: always on the same GPU, else only with P2P reads
// and writes. The reason names what decided.
func (t *Topology) CanShareDeviceMemory(busA, busB string) (bool, string) {
	i, j := t.Index(busA), t.Index(busB)
	switch {
	case i < 0:
		return false, fmt.Sprintf("no GPU at PCI address %q", busA)
	case j < 0:
		return false, fmt.Sprintf("no GPU at PCI address %q", busB)
	case i == j:
		return true, "same GPU"
	}
	l := t.Links[i][j]
	if l.P2PRead && l.P2PWrite {
		via := "PCIe P2P"
		if l.NVLink {
			via = "NVLink"
		}
		return true, fmt.Sprintf("%s between GPU %d and %d", via, i, j)
	}
	return false, fmt.Sprintf("no P2P read/write between GPU %d and %d (common ancestor: %s)", i, j, l.Ancestor)
}
