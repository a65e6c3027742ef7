package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/sim/report"
)

// openMemoryAgreed opens this rank's memory (openMemory); for a CUDA run the ranks then
// agree over world, so that a rank without a usable device fails every rank at once with
// its reason instead of leaving the others waiting for it in a collective.
func openMemoryAgreed(ctx context.Context, world *gloo.Group, cfg *Config, localRank int) (*memory, error) {
	m, err := openMemory(cfg, localRank)
	if cfg.Device != DeviceCUDA {
		return m, err
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	all, gerr := world.AllGather(ctx, []byte(msg))
	if gerr != nil {
		return nil, fmt.Errorf("runner: agreeing on device memory: %w (this rank: %v)", gerr, errors.Join(err, m.Close()))
	}
	var failed []string
	for r, b := range all {
		if len(b) > 0 {
			msg := strings.TrimPrefix(strings.TrimPrefix(string(b), deviceErrPrefix), ErrBadInput.Error()+": ")
			failed = append(failed, fmt.Sprintf("rank %d: %s", r, msg))
		}
	}
	if len(failed) == 0 {
		return m, nil
	}
	what := fmt.Sprintf("--device cuda failed on %d of %d ranks: %s", len(failed), len(all), strings.Join(failed, "; "))
	agreed := errors.New("runner: " + what)
	if errors.Is(err, ErrBadInput) {
		agreed = fmt.Errorf("%w: %s", ErrBadInput, what)
	}
	return nil, errors.Join(agreed, m.Close())
}

const deviceErrPrefix = "runner: --device cuda: "

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
