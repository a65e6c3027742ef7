package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cpcache/cpcache/hicache"
	"github.com/cpcache/cpcache/internal/redact"
	"github.com/cpcache/cpcache/sim/sched"
	"github.com/cpcache/cpcache/storage"
	"github.com/cpcache/cpcache/storage/stores"
)

// FaultHelp documents the --fault grammar (cpcache run --help and docs/operating.md).
const FaultHelp = `--fault SPEC injects failures, to rehearse a deployment's failure handling. SPEC is one
or more faults separated by ';', each KIND[:PARAM=VALUE,...]:
  copy-fail:rank=R,step=S          rank R reports its first copy finished at step S or later
                                   as failed (the group aborts the backup or makes the node
                                   stale, on every rank)
  diverge-tree:rank=R,step=S       rank R perturbs its tree (LRU order) before step S: every
                                   rank detects the divergence at S, quarantines, recovers
  diverge-placement:rank=R,step=S  the same with its L2 placement
  new-fail:rank=R                  rank R's cache fails to start: every rank reports it
  storage-hang[:after=D,for=D,op=OPS,rank=R]
                                   storage calls hang until their deadline, from D after the
                                   storage was opened, for D (default: to the end); OPS:
                                   exists, get, put, delete, clear joined by '+' (default
                                   all); rank: only its handle (default every rank's)
  storage-error[:after=D,for=D,op=OPS,rank=R]
                                   the same, failing at once
  storage-freeze[:after=D,for=D,op=OPS,rank=R]
                                   a file:// store's file system operations block in the
                                   "kernel", deaf to every deadline, as on a frozen ext4 or
                                   a hung NFS mount (default: to the end of the run); the
                                   calls are abandoned at their deadline
  flush:step=S[,when=now|idle]     every rank asks its cache to flush before step S (when=now,
                                   the default: refused on every rank alike while it is busy);
                                   when=idle: from step S the replica admits no request until
                                   its running ones finished and its I/O ended, then flushes
                                   (the flush is made, never refused) and admits again
  kill:rank=R,at=start|slabs|step[,step=S]
                                   rank R kills itself with SIGKILL before joining the job,
                                   before the slab exchange, or before step S
  stall:rank=R,step=S,for=D        rank R stops itself (SIGSTOP) before step S, for D
Steps count consensus steps of the rank's replica from 0; D is a Go duration (2s, 500ms).`

// Fault is one parsed --fault entry.
type Fault struct {
	Kind       string
	Rank       int // -1: every rank
	Step       uint64
	After, For time.Duration
	Ops        []string
	At         string // kill: start, slabs or step
	When       string // flush: FlushNow ("" too) or FlushIdle
}

// When a flush fault flushes (its when= parameter).
const (
	FlushNow  = "now"  // at its step, refused if the cache is busy then
	FlushIdle = "idle" // at the first step from its step at which the cache is idle, admitting nothing meanwhile
)

// faultParams are the parameters each kind accepts, and which it requires.
var faultParams = map[string]struct{ allowed, required []string }{
	"copy-fail":         {[]string{"rank", "step"}, []string{"rank"}},
	"diverge-tree":      {[]string{"rank", "step"}, []string{"rank"}},
	"diverge-placement": {[]string{"rank", "step"}, []string{"rank"}},
	"new-fail":          {[]string{"rank"}, []string{"rank"}},
	"storage-hang":      {[]string{"after", "for", "op", "rank"}, nil},
	"storage-error":     {[]string{"after", "for", "op", "rank"}, nil},
	"storage-freeze":    {[]string{"after", "for", "op", "rank"}, nil},
	"flush":             {[]string{"step", "when"}, []string{"step"}},
	"kill":              {[]string{"rank", "at", "step"}, []string{"rank", "at"}},
	"stall":             {[]string{"rank", "step", "for"}, []string{"rank", "step", "for"}},
}

var storageOps = []string{"exists", "get", "put", "delete", "clear"}

// ParseFaults parses a --fault SPEC (see FaultHelp); every error wraps ErrBadInput and names
// the bad part.
func ParseFaults(spec string) ([]Fault, error) {
	var out []Fault
	for part := range strings.SplitSeq(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		f, err := parseFault(part)
		if err != nil {
			return nil, bad("--fault %q: %v", part, err)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, bad("--fault %q: no fault given", spec)
	}
	return out, nil
}

func parseFault(part string) (Fault, error) {
	kind, params, _ := strings.Cut(part, ":")
	f := Fault{Kind: kind, Rank: -1}
	ps, ok := faultParams[kind]
	if !ok {
		return f, fmt.Errorf("unknown fault %q (known: %s)", kind, strings.Join(slices.Sorted(maps.Keys(faultParams)), ", "))
	}
	seen := map[string]bool{}
	for kv := range strings.SplitSeq(params, ",") {
		if kv == "" {
			continue
		}
		name, val, ok := strings.Cut(kv, "=")
		if !ok || val == "" {
			return f, fmt.Errorf("parameter %q is not NAME=VALUE", kv)
		}
		if !slices.Contains(ps.allowed, name) {
			return f, fmt.Errorf("%s takes no parameter %q (it takes %s)", kind, name, strings.Join(ps.allowed, ", "))
		}
		if seen[name] {
			return f, fmt.Errorf("parameter %q given twice", name)
		}
		seen[name] = true
		var err error
		switch name {
		case "rank":
			f.Rank, err = strconv.Atoi(val)
			if err != nil || f.Rank < 0 {
				err = fmt.Errorf("want a rank number")
			}
		case "step":
			if f.Step, err = strconv.ParseUint(val, 10, 63); err != nil {
				err = fmt.Errorf("want a step number")
			}
		case "after":
			f.After, err = parseDuration(val)
		case "for":
			f.For, err = parseDuration(val)
		case "op":
			f.Ops = strings.Split(val, "+")
			for _, op := range f.Ops {
				if !slices.Contains(storageOps, op) {
					err = fmt.Errorf("unknown operation %q (known: %s)", op, strings.Join(storageOps, ", "))
				}
			}
		case "when":
			f.When = val
			if val != FlushNow && val != FlushIdle {
				err = fmt.Errorf("want %s or %s", FlushNow, FlushIdle)
			}
		case "at":
			f.At = val
			if !slices.Contains([]string{"start", "slabs", "step"}, val) {
				err = fmt.Errorf("want start, slabs or step")
			}
		}
		if err != nil {
			return f, fmt.Errorf("%s=%s: %v", name, val, err)
		}
	}
	for _, name := range ps.required {
		if !seen[name] {
			return f, fmt.Errorf("%s needs %s=", kind, name)
		}
	}
	if kind == "kill" && f.At == "step" && !seen["step"] {
		return f, fmt.Errorf("kill at=step needs step=")
	}
	return f, nil
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("want a duration such as 2s or 500ms")
	}
	return d, nil
}

// checkFaultRanks rejects faults aimed at a rank the world does not have, and storage
// faults without the storage they need.
func (p *Plan) checkFaultRanks() error {
	for _, f := range p.Config.Faults {
		if f.Rank >= p.Layout.Config.World {
			return bad("--fault %s: rank %d is not in the world of %d ranks", f.Kind, f.Rank, p.Layout.Config.World)
		}
		if f.Kind == "storage-freeze" && !strings.HasPrefix(p.Config.Storage, "file:") {
			if p.Config.Storage == "" {
				return bad("--fault storage-freeze freezes a file system: it needs --storage file:///DIR")
			}
			return bad("--fault storage-freeze freezes a file system: it needs --storage file:///DIR, not %s", redact.URL(p.Config.Storage))
		}
	}
	return nil
}

// mine returns the faults of kind aimed at rank (or at every rank).
func (c *Config) mine(kind string, rank int) []Fault {
	var out []Fault
	for _, f := range c.Faults {
		if f.Kind == kind && (f.Rank < 0 || f.Rank == rank) {
			out = append(out, f)
		}
	}
	return out
}

// cacheFaults are rank's failpoints in the cache (nil: none).
func (c *Config) cacheFaults(rank int) *hicache.Faults {
	var hf hicache.Faults
	on := false
	for _, f := range c.mine("new-fail", rank) {
		hf.NewError, on = fmt.Errorf("--fault new-fail:rank=%d", f.Rank), true
	}
	for _, k := range []struct {
		kind string
		sf   *hicache.StepFault
	}{{"copy-fail", &hf.CopyFail}, {"diverge-tree", &hf.DivergeTree}, {"diverge-placement", &hf.DivergePlacement}} {
		for _, f := range c.mine(k.kind, rank) {
			*k.sf, on = hicache.StepFault{On: true, Step: f.Step}, true
		}
	}
	if !on {
		return nil
	}
	return &hf
}

// faultyStorage wraps rank's storage handle with its storage faults.
func (c *Config) faultyStorage(rank int, st storage.Storage) storage.Storage {
	for _, kind := range []string{"storage-hang", "storage-error", "storage-freeze"} {
		for _, f := range c.mine(kind, rank) {
			st = stores.WithFaults(st, stores.Faults{After: f.After, For: f.For, Hang: kind == "storage-hang", Freeze: kind == "storage-freeze", Ops: f.Ops})
		}
	}
	return st
}

// killPoint ends this process with SIGKILL when a kill fault names rank at this point (at
// "step": at step).
func (c *Config) killPoint(rank int, at string, step uint64) {
	for _, f := range c.mine("kill", rank) {
		if f.At == at && (at != "step" || f.Step == step) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}

// stallPoint stops this process (SIGSTOP) for the fault's duration when a stall fault names
// rank at step: a helper process sends SIGCONT.
func (c *Config) stallPoint(rank int, step uint64) {
	for _, f := range c.mine("stall", rank) {
		if f.Step != step {
			continue
		}
		pid := os.Getpid()
		wake := exec.Command("sh", "-c", fmt.Sprintf("sleep %.3f; kill -CONT %d", f.For.Seconds(), pid))
		if err := wake.Start(); err != nil {
			continue // no shell: no stall
		}
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		_ = wake.Wait()
	}
}

// faultRunner runs one rank's scheduler-level faults (kill, stall, flush) before its steps.
// nil when the run has no faults.
type faultRunner struct {
	cfg   *Config
	rank  int
	cache *hicache.Cache // the rank's cache, which flushes
	// idleFlushed marks the when=idle flushes (by index in mine("flush")) already made.
	idleFlushed map[int]bool
	// afterFlush, if set, runs after each flush made (the KV events dump of the publishing
	// rank).
	afterFlush func() error
}

func newFaultRunner(cfg *Config, rank int, cache *hicache.Cache) *faultRunner {
	if len(cfg.Faults) == 0 {
		return nil
	}
	return &faultRunner{cfg: cfg, rank: rank, cache: cache, idleFlushed: map[int]bool{}}
}

// HoldsAdmissions (sched.Faults) reports whether a when=idle flush is due at step: from its step until it
// is made the replica admits nothing, so that its running requests finish, its I/O ends
// and the cache goes idle. Replicated (steps and the flushes made are).
func (f *faultRunner) HoldsAdmissions(step uint64) bool {
	if f == nil {
		return false
	}
	for i, fl := range f.cfg.mine("flush", f.rank) {
		if fl.When == FlushIdle && step >= fl.Step && !f.idleFlushed[i] {
			return true
		}
	}
	return false
}

// BeforeStep (sched.Faults) runs the faults due before step, counting the flushes in counts
// and their collectives in local. A flush is replicated: every
// rank of the replica makes it at the same step and gets the same answer (refused while
// busy). A when=idle flush is made at the first step from its own at which the cache is idle
// and not in quarantine (both replicated outside quarantine, and quarantine is entered and
// left at the same step everywhere), so it is never refused.
func (f *faultRunner) BeforeStep(ctx context.Context, step uint64, counts *sched.Counts, local *sched.Local) error {
	if f == nil {
		return nil
	}
	f.cfg.killPoint(f.rank, "step", step)
	f.cfg.stallPoint(f.rank, step)
	for i, fl := range f.cfg.mine("flush", f.rank) {
		if fl.When == FlushIdle {
			if step < fl.Step || f.idleFlushed[i] || f.cache.Quarantined() || !f.cache.Idle() {
				continue
			}
			f.idleFlushed[i] = true
		} else if fl.Step != step {
			continue
		}
		before := f.cache.Stats().Collectives
		err := f.cache.Flush(ctx)
		local.FlushCollectives += f.cache.Stats().Collectives - before
		switch {
		case err == nil:
			counts.Flushes++
			if f.afterFlush != nil {
				if err := f.afterFlush(); err != nil {
					return err
				}
			}
		case errors.Is(err, hicache.ErrBusy):
			counts.FlushesRefused++
		default:
			return err
		}
	}
	return nil
}
