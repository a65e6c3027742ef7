package report

import (
	"fmt"
	"io"
	"strings"
)

// DeviceReport is the memory and copy bandwidth of a --device cuda run.
type DeviceReport struct {
	Devices        []string `json:"devices"` // "ordinal name" of every device used
	RanksPerDevice int      `json:"ranks_per_device"`
	L1Memory       string   `json:"l1_memory"`
	L2Memory       string   `json:"l2_memory"`
	Batched        bool     `json:"batched"` // every rank's last backup used cuMemcpyBatchAsync

	// Page copies: bytes / time with a transfer in flight, per rank (summed over ranks),
	// for backups (L1 → L2) and loads (L2 → L1).
	BackupGBps float64 `json:"backup_gbps"`
	LoadGBps   float64 `json:"load_gbps"`
	// The same directions as one large copy on rank 0 after the run (its device otherwise
	// idle): the baseline of the page copies.
	LargeBackupGBps float64 `json:"large_backup_gbps"`
	LargeLoadGBps   float64 `json:"large_load_gbps"`
	BaselineError   string  `json:"baseline_error,omitempty"`
}

func (r *DeviceReport) writeText(w io.Writer) {
	if r == nil {
		return
	}
	ratio := func(page, large float64) string {
		if large <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", page/large)
	}
	fmt.Fprintf(w, "  device               %s (up to %d ranks per device)\n", strings.Join(r.Devices, ", "), r.RanksPerDevice)
	fmt.Fprintf(w, "  L1 memory            %s\n", r.L1Memory)
	fmt.Fprintf(w, "  L2 memory            %s\n", r.L2Memory)
	fmt.Fprintf(w, "  page copies          backup %.2f GB/s, load %.2f GB/s per rank (batched: %v)\n", r.BackupGBps, r.LoadGBps, r.Batched)
	if r.BaselineError != "" {
		fmt.Fprintf(w, "  large copies         not measured: %s\n", r.BaselineError)
		return
	}
	fmt.Fprintf(w, "  large copies         backup direction %.2f GB/s, load direction %.2f GB/s (rank 0 alone); page/large %s, %s\n",
		r.LargeBackupGBps, r.LargeLoadGBps, ratio(r.BackupGBps, r.LargeBackupGBps), ratio(r.LoadGBps, r.LargeLoadGBps))
}
