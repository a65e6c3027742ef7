package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/cpcache/cpcache/cuda"
	"github.com/cpcache/cpcache/nccl"
)

func init() {
	register(command{name: "gpu-info", summary: "print CUDA driver, NCCL, devices and GPU topology (exits 0 without a GPU)", run: runGPUInfo})
}

// runGPUInfo reports what this machine offers for GPU work. Libraries that cannot be loaded
// are reported with the reason, and the command still exits 0: "no GPU" is an answer.
func runGPUInfo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("gpu-info", "", "Prints the CUDA driver and NCCL versions, the devices and their topology.\n"+
		"Libraries are loaded at run time: CPCACHE_CUDA_LIBRARY and CPCACHE_NCCL_LIBRARY override their paths.", stderr)
	if status, done := parseFlags(fs, args); done {
		return status
	}
	if fs.NArg() > 0 {
		return fail(stderr, 2, fmt.Errorf("gpu-info: unexpected argument %q", fs.Arg(0)))
	}
	printCUDA(stdout)
	printNCCL(stdout)
	printTopology(stdout)
	return 0
}

// checkCUDA says, in one short line, why this machine cannot run CUDA ranks: no driver
// library (its soname and the override variable, not every path tried), a driver that
// does not start, or no device; nil when a device is there.
func checkCUDA() error {
	drv, err := cuda.Open()
	if le, ok := err.(*cuda.LoadError); ok && errors.Is(le, cuda.ErrLibraryNotFound) {
		return fmt.Errorf("no CUDA driver: %s not found (set %s to its path)", le.Library, le.Env)
	}
	if err != nil {
		return err
	}
	defer drv.Close()
	n, err := drv.DeviceCount()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("the CUDA driver %s sees no device", drv.VersionString())
	}
	return nil
}

func printCUDA(w io.Writer) {
	drv, err := cuda.Open()
	if err != nil {
		fmt.Fprintf(w, "cuda: not available: %v\n", err)
		return
	}
	defer drv.Close()
	batch := drv.BatchCopyABI()
	if batch == "" {
		batch = "none (per-copy fallback)"
	}
	fmt.Fprintf(w, "cuda: driver API %s (%d) from %s; batched copies: %s\n", drv.VersionString(), drv.Version(), drv.Path(), batch)
	n, err := drv.DeviceCount()
	if err != nil {
		fmt.Fprintf(w, "cuda: device count: %v\n", err)
		return
	}
	fmt.Fprintf(w, "cuda: %d device(s)\n", n)
	for i := 0; i < n; i++ {
		printDevice(w, drv, i)
	}
}

func printDevice(w io.Writer, drv *cuda.Driver, i int) {
	dev, err := drv.Device(i)
	if err != nil {
		fmt.Fprintf(w, "  [%d] %v\n", i, err)
		return
	}
	defer dev.Close()
	name, err := dev.Name()
	if err != nil {
		fmt.Fprintf(w, "  [%d] %v\n", i, err)
		return
	}
	major, minor, _ := dev.ComputeCapability()
	sms, _ := dev.Attribute(cuda.AttrMultiprocessorCount)
	free, total, _ := dev.MemInfo()
	bus, _ := dev.PCIBusID()
	fmt.Fprintf(w, "  [%d] %s  sm_%d%d  %d SMs  %.1f GiB (%.1f GiB free)  pci %s  numa %d\n",
		i, name, major, minor, sms, gib(total), gib(free), bus, cuda.NUMANode(bus))
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

func printNCCL(w io.Writer) {
	lib, err := nccl.Open()
	if err != nil {
		fmt.Fprintf(w, "nccl: not available: %v\n", err)
		return
	}
	defer lib.Close()
	fmt.Fprintf(w, "nccl: %v from %s; non-blocking communicators: %v; split: %v\n",
		lib.Version(), lib.Path(), yesNo(lib.Supports("config")), yesNo(lib.Supports("split")))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func printTopology(w io.Writer) {
	t, err := cuda.QueryTopology()
	if err != nil {
		fmt.Fprintf(w, "topology: not available: %v\n", err)
		return
	}
	fmt.Fprintf(w, "topology (nvml): kernel driver %s, %d GPU(s)\n", t.DriverVersion, len(t.GPUs))
	for _, g := range t.GPUs {
		fmt.Fprintf(w, "  gpu %d  %s  pci %s  numa %d  %.1f GiB  %s\n", g.Index, g.Name, g.PCIBusID, g.NUMANode, gib(g.MemoryTotal), g.UUID)
	}
	for i := range t.GPUs {
		for j := i + 1; j < len(t.GPUs); j++ {
			ok, why := t.CanShareDeviceMemory(t.GPUs[i].PCIBusID, t.GPUs[j].PCIBusID)
			fmt.Fprintf(w, "  gpu %d <-> gpu %d: share device memory: %s (%s; common ancestor: %s)\n", i, j, yesNo(ok), why, t.Links[i][j].Ancestor)
		}
	}
}
