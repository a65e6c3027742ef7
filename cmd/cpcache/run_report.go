package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/cpcache/cpcache/cmd/cpcache/internal/runner"
	"github.com/cpcache/cpcache/sim/report"
)

// reportOpts are the flags of `cpcache run` about time, the cost model, sweeps and the
// HTML report.
type reportOpts struct {
	time         string
	speed        float64
	costProfile  string
	cost         string
	prefetchSync bool
	sweep        string
	html         string
}

// reportPaths are the files a report is written to besides stdout ("": none).
type reportPaths struct{ json, html string }

func (r *reportOpts) flags(fs *flag.FlagSet) {
	fs.StringVar(&r.time, "time", "", "virtual: replay arrival times on a simulated clock (default for traces); none: serve back to back (default for synthetic)")
	fs.Float64Var(&r.speed, "speed", 1, "with --time virtual: arrival times are divided by this")
	fs.StringVar(&r.costProfile, "cost-profile", runner.DefaultCostProfile,
		"cost model of virtual time: a built-in profile ("+strings.Join(runner.CostProfiles(), ", ")+") or a JSON file of its fields")
	fs.StringVar(&r.cost, "cost", "", "override cost-profile fields: field=value,... (e.g. prefill_ns_per_token=3000,h2d_gbps=25)")
	fs.BoolVar(&r.prefetchSync, "prefetch-sync", false, "with --storage: wait for a prefetch in steps where nothing decodes (a prefetch that does not overlap decode, for comparison)")
	fs.StringVar(&r.sweep, "sweep", "", "run once per value and print one table: PARAM=V1,V2,... with PARAM one of "+strings.Join(runner.SweepParams, ", "))
	fs.StringVar(&r.html, "html", "", "also write a self-contained HTML report with charts to this file")
}

// apply copies the time flags into cfg.
func (r *reportOpts) apply(cfg *runner.Config) error {
	// The configuration reads a Speed of 0 as its default, 1: a --speed 0 would run at 1.
	if !(r.speed > 0) || math.IsInf(r.speed, 0) {
		return fmt.Errorf("--speed %v: must be a positive number (arrival times are divided by it)", r.speed)
	}
	if mode := r.time; r.speed != 1 && (mode == runner.TimeNone || mode == "" && cfg.Workload != runner.WorkloadTrace) {
		return fmt.Errorf("--speed %v needs --time virtual (without it requests do not wait for their arrival times)", r.speed)
	}
	prof, err := runner.LoadCostProfile(r.costProfile, r.cost)
	if err != nil {
		return err
	}
	cfg.Time = runner.TimeConfig{Mode: r.time, Speed: r.speed, Cost: prof, PrefetchSync: r.prefetchSync}
	if r.sweep != "" {
		if _, _, err := runner.ParseSweep(r.sweep); err != nil {
			return err
		}
	}
	return nil
}

// withoutFlags returns args without the named flags (and their values).
func withoutFlags(args []string, names ...string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		name := strings.TrimLeft(args[i], "-")
		base, _, hasValue := strings.Cut(name, "=")
		if strings.HasPrefix(args[i], "-") && slices.Contains(names, base) {
			if !hasValue {
				i++ // the value is the next argument
			}
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// runSweep runs the workload once per value of the swept parameter (each a run of its own
// ranks with -PARAM=VALUE added to the flags), then prints one table; --json gets every
// report, --html the charts of the last value's run and the sweep chart.
func runSweep(o *runOpts, args []string, stdout, stderr io.Writer) int {
	param, values, err := runner.ParseSweep(o.report.sweep)
	if err != nil {
		return fail(stderr, 2, fmt.Errorf("run: %w", err))
	}
	base := withoutFlags(args, "sweep", "html", "json")
	// Every value is checked before the first run starts; each run prepares its plan
	// again when it starts (a plan holds the whole workload).
	var cfgs []runner.Config
	var runArgs [][]string
	for _, v := range values {
		a := append(base[:len(base):len(base)], "-"+param+"="+v)
		fs := newFlagSet("run", "[flags]", runDescription, stderr)
		ro := runFlags(fs)
		if status, done := parseFlags(fs, a); done {
			return status
		}
		if err := ro.finish(); err != nil {
			return fail(stderr, 2, fmt.Errorf("run: --sweep %s=%s: %w", param, v, err))
		}
		p, err := runner.Prepare(ro.cfg)
		if err == nil {
			err = p.CheckHost(ro.cfg.Layout.World)
		}
		if err != nil {
			return fail(stderr, 2, fmt.Errorf("run: --sweep %s=%s: %w", param, v, err))
		}
		cfgs, runArgs = append(cfgs, ro.cfg), append(runArgs, a)
	}
	ctx, signalled := signalContext()
	sw := &report.SweepResult{Param: param, Values: values}
	for i, cfg := range cfgs {
		fmt.Fprintf(stderr, "run: --sweep %s=%s\n", param, values[i])
		p, err := runner.Prepare(cfg)
		if err != nil {
			return fail(stderr, 2, fmt.Errorf("run: --sweep %s=%s: %w", param, values[i], err))
		}
		rep, status := startRanks(ctx, p, runArgs[i], o.metrics, stdout, stderr, func(_ *runner.Watcher, _ *report.Report, status int) int { return status })
		if sig := signalled(); sig != 0 {
			return 128 + int(sig)
		}
		if rep == nil || status != 0 {
			return max(status, 1)
		}
		sw.Reports = append(sw.Reports, rep)
	}
	sw.Reports[len(sw.Reports)-1].WriteText(stdout)
	fmt.Fprintln(stdout)
	report.WriteSweepTable(stdout, sw)
	if err := writeOutput(o.jsonPath, "--json", func(w io.Writer) error { return report.WriteSweepJSON(w, sw) }); err != nil {
		return fail(stderr, 1, err)
	}
	last := sw.Reports[len(sw.Reports)-1]
	if err := writeOutput(o.report.html, "--html", func(w io.Writer) error { return report.WriteHTML(w, last, sw) }); err != nil {
		return fail(stderr, 1, err)
	}
	return 0
}
