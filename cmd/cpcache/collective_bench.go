package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/parallel"
)

func init() {
	register(command{name: "collective-bench", summary: "time the small collectives on the world and attention-CP groups (run under launch or mpirun)", run: runCollectiveBench})
}

// benchGroups are the groups a backend gives collective-bench on this rank.
type benchGroups struct {
	World parallel.Group
	CP    parallel.Group // this rank's attention-CP group of the layout
	Close func() error
}

// benchBackend creates the groups of one backend; every rank calls it collectively.
type benchBackend func(ctx context.Context, l *parallel.Layout, store string, timeout time.Duration) (*benchGroups, error)

// benchBackends maps --backend names to constructors.
var benchBackends = map[string]benchBackend{"gloo": glooBenchGroups}

func glooBenchGroups(ctx context.Context, l *parallel.Layout, store string, timeout time.Duration) (*benchGroups, error) {
	w, err := gloo.NewWorld(ctx, gloo.Options{Store: store, Timeout: timeout})
	if err != nil {
		return nil, err
	}
	lg, err := gloo.NewLayoutGroups(w, l)
	if err != nil {
		w.Close()
		return nil, err
	}
	return &benchGroups{World: w, CP: lg.Group(parallel.KindAttnCP), Close: func() error {
		lg.Close()
		return w.Close()
	}}, nil
}

// benchOp is one measured collective.
type benchOp struct {
	name string
	run  func(ctx context.Context, g parallel.Group) error
}

var benchOps = []benchOp{
	{"allreduce_8xi64_min", func(ctx context.Context, g parallel.Group) error {
		v := []int64{1, 2, 3, 4, 5, 6, 7, int64(g.Rank())}
		return g.AllReduce(ctx, parallel.Min, v)
	}},
	{"broadcast_4KiB", func(ctx context.Context, g parallel.Group) error {
		var data []byte
		if g.Rank() == 0 {
			data = make([]byte, 4096)
		}
		_, err := g.Broadcast(ctx, 0, data)
		return err
	}},
	{"allgather_64B", func(ctx context.Context, g parallel.Group) error {
		_, err := g.AllGather(ctx, make([]byte, 64))
		return err
	}},
	{"barrier", func(ctx context.Context, g parallel.Group) error { return g.Barrier(ctx) }},
}

// benchResult is one (group, op) measurement, by the group's rank 0.
type benchResult struct {
	Backend  string  `json:"backend"`
	Group    string  `json:"group"`
	Size     int     `json:"size"`
	Op       string  `json:"op"`
	MedianUS float64 `json:"median_us"`
	P99US    float64 `json:"p99_us"`
}

// benchReport is what rank 0 prints.
type benchReport struct {
	Layout  string        `json:"layout"`
	Iters   int           `json:"iters"`
	Results []benchResult `json:"results"`
}

func runCollectiveBench(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("collective-bench", "[layout flags] [--iters N] [--json]",
		"Run under `cpcache launch -n N` or mpirun. Times AllReduce of 8 int64 (MIN),\n"+
			"Broadcast of 4 KiB, AllGather of 64 B and Barrier, back to back, first on the world\n"+
			"group, then on every attention-CP group of the layout at once. Rank 0 prints the\n"+
			"median and p99 microseconds per operation as measured by each group's rank 0.", stderr)
	cfg := layoutFlags(fs, defaultLayoutFlags)
	iters := fs.Int("iters", 1000, "timed operations per collective and group")
	warmup := fs.Int("warmup", 50, "untimed operations before timing")
	asJSON := fs.Bool("json", false, "print one JSON object")
	backends := fs.String("backend", "gloo", "backends to measure, comma-separated: "+strings.Join(backendNames(), ", ")+"; both = gloo,shm")
	store := fs.String("store", "", "rendezvous store URL (default: CPCACHE_STORE, set by launch)")
	timeout := fs.Duration("timeout", time.Minute, "deadline of every collective")
	if status, done := parseFlags(fs, args); done {
		return status
	}
	if fs.NArg() > 0 {
		return fail(stderr, 2, fmt.Errorf("collective-bench: unexpected argument %q", fs.Arg(0)))
	}
	if *iters < 1 || *warmup < 0 {
		return fail(stderr, 2, fmt.Errorf("collective-bench: --iters %d / --warmup %d: need iters >= 1, warmup >= 0", *iters, *warmup))
	}
	if *timeout <= 0 { // the groups would take their default instead
		return fail(stderr, 2, fmt.Errorf("collective-bench: --timeout %v must be positive", *timeout))
	}
	env, err := parallel.FromEnv()
	if err != nil {
		return fail(stderr, 2, err)
	}
	if cfg.World == 0 {
		cfg.World = env.WorldSize
	}
	if cfg.World != env.WorldSize {
		return fail(stderr, 2, fmt.Errorf("collective-bench: --world %d but the launcher started %d ranks", cfg.World, env.WorldSize))
	}
	l, err := parallel.NewLayout(*cfg)
	if err != nil {
		return fail(stderr, 2, err)
	}
	var names []string
	for _, b := range expandBackends(*backends) {
		if _, ok := benchBackends[b]; !ok {
			return fail(stderr, 2, fmt.Errorf("collective-bench: unknown backend %q (have %s)", b, strings.Join(backendNames(), ", ")))
		}
		names = append(names, b)
	}
	ctx := context.Background()
	report := benchReport{Layout: l.String(), Iters: *iters}
	for _, name := range names {
		res, err := benchBackendRun(ctx, name, benchBackends[name], l, *store, *timeout, *warmup, *iters)
		if err != nil {
			status := 1
			if errors.Is(err, parallel.ErrBadArgument) { // no store, a bad one: the user's to fix
				status = 2
			}
			if strings.HasPrefix(err.Error(), name+": ") { // gloo's errors name it already
				return fail(stderr, status, fmt.Errorf("collective-bench: %w", err))
			}
			return fail(stderr, status, fmt.Errorf("collective-bench: %s: %w", name, err))
		}
		report.Results = append(report.Results, res...)
	}
	if env.Rank != 0 {
		return 0
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(report); err != nil {
			return fail(stderr, 1, err)
		}
		return 0
	}
	fmt.Fprintf(stdout, "collective-bench: %s, %d timed ops each (median/p99 by each group's rank 0)\n", report.Layout, report.Iters)
	fmt.Fprintf(stdout, "%-8s %-20s %-22s %12s %12s\n", "backend", "group", "op", "median_us", "p99_us")
	for _, r := range report.Results {
		fmt.Fprintf(stdout, "%-8s %-20s %-22s %12.1f %12.1f\n", r.Backend, r.Group, r.Op, r.MedianUS, r.P99US)
	}
	printBackendRatios(stdout, report.Results)
	return 0
}

func backendNames() []string {
	var n []string
	for k := range benchBackends {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// benchBackendRun measures one backend and returns, on every rank, the results of the world
// group and of every CP group (gathered over the world).
func benchBackendRun(ctx context.Context, name string, mk benchBackend, l *parallel.Layout, store string,
	timeout time.Duration, warmup, iters int) ([]benchResult, error) {
	gs, err := mk(ctx, l, store, timeout)
	if err != nil {
		return nil, err
	}
	defer gs.Close()
	var mine []benchResult // measured where this rank is its group's rank 0
	for _, g := range []parallel.Group{gs.World, gs.CP} {
		if err := gs.World.Barrier(ctx); err != nil {
			return nil, err
		}
		for _, op := range benchOps {
			med, p99, err := timeOp(ctx, g, op, warmup, iters)
			if err != nil {
				return nil, fmt.Errorf("%s on %s: %w", op.name, g.Name(), err)
			}
			if g.Rank() == 0 {
				mine = append(mine, benchResult{Backend: name, Group: g.Name(), Size: g.Size(), Op: op.name, MedianUS: med, P99US: p99})
			}
		}
	}
	b, err := json.Marshal(mine)
	if err != nil {
		return nil, err
	}
	parts, err := gs.World.AllGather(ctx, b)
	if err != nil {
		return nil, err
	}
	var all []benchResult // each group's results come from its rank 0 alone: no duplicates
	for r, p := range parts {
		var rs []benchResult
		if err := json.Unmarshal(p, &rs); err != nil {
			return nil, fmt.Errorf("results of rank %d: %w", r, err)
		}
		all = append(all, rs...)
	}
	return all, nil
}

// timeOp runs op warmup times, then times iters runs one by one; it returns the median and
// the 99th percentile in microseconds.
func timeOp(ctx context.Context, g parallel.Group, op benchOp, warmup, iters int) (median, p99 float64, err error) {
	for i := 0; i < warmup; i++ {
		if err := op.run(ctx, g); err != nil {
			return 0, 0, err
		}
	}
	d := make([]time.Duration, iters)
	for i := range d {
		t0 := time.Now()
		if err := op.run(ctx, g); err != nil {
			return 0, 0, err
		}
		d[i] = time.Since(t0)
	}
	slices.Sort(d)
	us := func(q float64) float64 {
		i := min(int(q*float64(len(d))), len(d)-1)
		return float64(d[i]) / float64(time.Microsecond)
	}
	return us(0.5), us(0.99), nil
}
