package runner

import (
	"fmt"
	"slices"

	"github.com/cpcache/cpcache/sim/report"
)

// buildDeviceReport sums the ranks' device results; mem is rank 0's memory, which measures
// the large-copy baseline. Nil for host runs.
func buildDeviceReport(results []rankResult, mem *memory) *report.DeviceReport {
	if results[0].Device == nil {
		return nil
	}
	r := &report.DeviceReport{L1Memory: "device memory (cuMemAlloc)", Batched: true}
	perDevice := map[string]int{}
	var wb, lb int64
	var ws, ls float64
	for _, x := range results {
		d := x.Device
		if d == nil {
			continue
		}
		perDevice[fmt.Sprintf("%d %s", d.Ordinal, d.Name)]++
		r.Batched = r.Batched && d.Batched
		wb, ws, lb, ls = wb+d.WriteBytes, ws+d.WriteSeconds, lb+d.LoadBytes, ls+d.LoadSeconds
		if d.L2 == L2Device {
			r.L2Memory = "device memory shared over CUDA IPC (one slab per CP rank)"
		} else {
			r.L2Memory = "pinned host shared memory (cuMemHostRegister, addressed by its device pointer)"
		}
	}
	for name, n := range perDevice {
		r.Devices = append(r.Devices, name)
		r.RanksPerDevice = max(r.RanksPerDevice, n)
	}
	slices.Sort(r.Devices)
	r.BackupGBps, r.LoadGBps = gbps(wb, ws), gbps(lb, ls)
	var err error
	if r.LargeBackupGBps, r.LargeLoadGBps, err = mem.largeCopyGBps(); err != nil {
		r.BaselineError = err.Error()
	}
	return r
}
