package parallel

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Env is what a launcher told this process about its place in the job.
type Env struct {
	Rank, WorldSize           int
	LocalRank, LocalWorldSize int
	MasterAddr                string // MASTER_ADDR, if set
	MasterPort                int    // MASTER_PORT, if set (0 otherwise)
	Store                     string // CPCACHE_STORE: rendezvous store URL, if set
	Source                    string // "torchrun", "openmpi", "slurm" or "single"
}

// ErrBadEnv is wrapped by every launcher-environment error.
var ErrBadEnv = errors.New("parallel: bad launcher environment")

// EnvSourceVar forces one launcher's variables and disables cross-checks.
const EnvSourceVar = "CPCACHE_ENV_SOURCE"

type envSource struct {
	name                             string
	rank, size, localRank, localSize string // rank is also the marker: set means this launcher ran us
	// allocation: the variables describe the job allocation, and a launcher started inside it
	// (mpirun or torchrun in an sbatch script, torchrun under srun) inherits them with values
	// of its own launch step; they are read only when no launcher above them ran us.
	allocation bool
}

// Sources in precedence order: torchrun-style variables are what `cpcache launch` and
// torchrun set explicitly for each process; OpenMPI's are set by mpirun per process; Slurm's
// last, since mpirun inside an allocation inherits the batch step's SLURM_PROCID.
var envSources = []envSource{
	{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", false},
	{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", false},
	{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", true},
}

// FromEnv reads the process's rank and world from the launcher's variables, in precedence
// order torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), OpenMPI
// (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID; the local size from SLURM_NTASKS_PER_NODE, else this node's entry, by
// SLURM_NODEID, of SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE). Slurm's are read only
// when neither of the others is set: mpirun or torchrun inside an allocation inherit them from
// their own launch step. torchrun's and OpenMPI's, when both are present, must agree on rank
// and world size, else the error names the variables; CPCACHE_ENV_SOURCE=torchrun|openmpi|slurm
// picks one and skips the check. With no launcher variables it returns a single-rank Env.
func FromEnv() (Env, error) { return fromEnv(os.LookupEnv) }

func fromEnv(lookup func(string) (string, bool)) (Env, error) {
	var found []Env
	var foundSrc []envSource
	forced, _ := lookup(EnvSourceVar)
	if forced != "" && !knownSource(forced) {
		return Env{}, fmt.Errorf("%w: %s=%q (want torchrun, openmpi or slurm)", ErrBadEnv, EnvSourceVar, forced)
	}
	for _, src := range envSources {
		if forced != "" && src.name != forced {
			continue
		}
		if _, ok := lookup(src.rank); !ok {
			continue
		}
		if src.allocation && len(found) > 0 {
			continue // inherited by the launcher that ran us
		}
		e, err := readSource(lookup, src)
		if err != nil {
			return Env{}, err
		}
		found = append(found, e)
		foundSrc = append(foundSrc, src)
	}
	if forced != "" && len(found) == 0 {
		return Env{}, fmt.Errorf("%w: %s=%s but its variables are not set", ErrBadEnv, EnvSourceVar, forced)
	}
	var e Env
	if len(found) == 0 {
		e = Env{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}
	} else {
		e = found[0]
		for i := 1; i < len(found); i++ {
			if found[i].Rank != e.Rank || found[i].WorldSize != e.WorldSize {
				a, b := foundSrc[0], foundSrc[i]
				return Env{}, fmt.Errorf("%w: launchers disagree: %s=%d %s=%d but %s=%d %s=%d (set %s to choose one)",
					ErrBadEnv, a.rank, e.Rank, a.size, e.WorldSize, b.rank, found[i].Rank, b.size, found[i].WorldSize, EnvSourceVar)
			}
		}
	}
	e.MasterAddr, _ = lookup("MASTER_ADDR")
	if p, ok := lookup("MASTER_PORT"); ok && p != "" {
		port, err := strconv.Atoi(p)
		if err != nil || port <= 0 || port > 65535 {
			return Env{}, fmt.Errorf("%w: MASTER_PORT=%q is not a port", ErrBadEnv, p)
		}
		e.MasterPort = port
	}
	e.Store, _ = lookup("CPCACHE_STORE")
	return e, nil
}

// UnderLauncher reports whether a launcher that sets each process's own variables started
// this one: torchrun-style (RANK) or OpenMPI (OMPI_COMM_WORLD_RANK) ones. Slurm's are not
// enough: they describe the allocation, and a command run by hand inside it sees them too.
func UnderLauncher() bool { return underLauncher(os.LookupEnv) }

func underLauncher(lookup func(string) (string, bool)) bool {
	for _, src := range envSources {
		if _, ok := lookup(src.rank); ok && !src.allocation {
			return true
		}
	}
	return false
}

// LauncherVars lists the variables that place a process in its job: every launcher's rank,
// world size, local rank and local world size variables FromEnv reads, EnvSourceVar,
// CPCACHE_STORE and CPCACHE_JOB_ID. A launcher drops them from its children's environment
// before setting its own.
func LauncherVars() []string {
	vars := []string{EnvSourceVar, "CPCACHE_STORE", EnvJobID}
	for _, s := range envSources {
		vars = append(vars, s.rank, s.size, s.localRank, s.localSize)
	}
	return append(append(vars, slurmTaskCountVars[1:]...), slurmNodeIDVar)
}

func knownSource(name string) bool {
	for _, s := range envSources {
		if s.name == name {
			return true
		}
	}
	return false
}

func readSource(lookup func(string) (string, bool), src envSource) (Env, error) {
	num := func(name string, required bool, def int) (int, error) {
		v, ok := lookup(name)
		if !ok && required {
			return 0, fmt.Errorf("%w: %s is set but %s is not", ErrBadEnv, src.rank, name)
		}
		if !ok || (v == "" && !required) {
			return def, nil
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return 0, fmt.Errorf("%w: %s=%q is not an integer", ErrBadEnv, name, v)
		}
		return n, nil
	}
	var e Env
	var err error
	if e.Rank, err = num(src.rank, true, 0); err != nil {
		return Env{}, err
	}
	if e.WorldSize, err = num(src.size, true, 0); err != nil {
		return Env{}, err
	}
	if e.LocalRank, err = num(src.localRank, false, e.Rank); err != nil {
		return Env{}, err
	}
	localSize := src.localSize
	if src.name == "slurm" {
		localSize, e.LocalWorldSize, err = slurmLocalSize(lookup, e.WorldSize)
	} else {
		e.LocalWorldSize, err = num(src.localSize, false, e.WorldSize)
	}
	if err != nil {
		return Env{}, err
	}
	e.Source = src.name
	switch {
	case e.WorldSize < 1:
		return Env{}, fmt.Errorf("%w: %s=%d must be positive", ErrBadEnv, src.size, e.WorldSize)
	case e.Rank < 0 || e.Rank >= e.WorldSize:
		return Env{}, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrBadEnv, src.rank, e.Rank, src.size, e.WorldSize)
	case e.LocalWorldSize < 1 || e.LocalWorldSize > e.WorldSize:
		return Env{}, fmt.Errorf("%w: %s=%d must be in 1..%s=%d", ErrBadEnv, localSize, e.LocalWorldSize, src.size, e.WorldSize)
	case e.LocalRank < 0 || e.LocalRank >= e.LocalWorldSize:
		return Env{}, fmt.Errorf("%w: %s=%d is not below %s=%d", ErrBadEnv, src.localRank, e.LocalRank, localSize, e.LocalWorldSize)
	}
	return e, nil
}

// slurmTaskCountVars give the tasks per node under Slurm, in the order they are tried:
// SLURM_NTASKS_PER_NODE is set only when --ntasks-per-node was given; srun always sets the
// step's (and the job's) distribution.
var slurmTaskCountVars = []string{"SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}

// slurmNodeIDVar is this node's index in the job step's node list.
const slurmNodeIDVar = "SLURM_NODEID"

// slurmLocalSize returns the number of tasks on this node and the variable it came from:
// the first of slurmTaskCountVars that is set, a count ("4") or a per-node list
// ("4(x2),3"), whose entry for SLURM_NODEID (default 0) is taken. With none set, it is world
// (every task on this node), as for the other launchers.
func slurmLocalSize(lookup func(string) (string, bool), world int) (string, int, error) {
	for _, name := range slurmTaskCountVars {
		v, ok := lookup(name)
		if !ok || v == "" {
			continue
		}
		node := 0
		if id, ok := lookup(slurmNodeIDVar); ok && id != "" {
			n, err := strconv.Atoi(strings.TrimSpace(id))
			if err != nil || n < 0 {
				return name, 0, fmt.Errorf("%w: %s=%q is not a node index", ErrBadEnv, slurmNodeIDVar, id)
			}
			node = n
		}
		n, err := slurmNodeTasks(v, node)
		if err != nil {
			return name, 0, fmt.Errorf("%w: %s=%q: %v", ErrBadEnv, name, v, err)
		}
		return name, n, nil
	}
	return slurmTaskCountVars[0], world, nil
}

// slurmNodeTasks is entry node of a Slurm per-node task list: "4", or counts separated by
// commas, each optionally followed by "(xR)" for R consecutive nodes ("4(x2),3").
func slurmNodeTasks(list string, node int) (int, error) {
	first := -1
	for _, item := range strings.Split(list, ",") {
		count, repeat := strings.TrimSpace(item), 1
		if c, r, ok := strings.Cut(count, "(x"); ok {
			rs, ok := strings.CutSuffix(r, ")")
			n, err := strconv.Atoi(rs)
			if !ok || err != nil || n < 1 {
				return 0, fmt.Errorf("bad repeat in %q", item)
			}
			count, repeat = c, n
		}
		n, err := strconv.Atoi(count)
		if err != nil {
			return 0, fmt.Errorf("%q is not an integer", count)
		}
		if first < 0 {
			first = n
		}
		if node < repeat {
			return n, nil
		}
		node -= repeat
	}
	if first < 0 {
		return 0, fmt.Errorf("no count")
	}
	return first, nil // fewer entries than nodes (a count per job, not per step): the first
}

// EnvJobID names this process's job to the rendezvous: every rank of one job has the same
// value, and jobs that share a rendezvous store at once have different ones. cpcache launch
// (and cpcache run, for its local ranks) set it.
const EnvJobID = "CPCACHE_JOB_ID"

// jobIDVars are the launchers' job ids, in the order JobIDFromEnv tries them: torchrun's run
// id, OpenMPI's job id (ORTE, then PMIx), Slurm's job id (with its step, below).
var jobIDVars = []string{"TORCHELASTIC_RUN_ID", "OMPI_MCA_orte_ess_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"}

// JobIDFromEnv returns the id of this process's job: CPCACHE_JOB_ID if set, else the first
// launcher job id that is set: torchrun's TORCHELASTIC_RUN_ID (with MASTER_ADDR:MASTER_PORT,
// since its default run id "none" is the same for every job), OpenMPI's
// OMPI_MCA_orte_ess_jobid or PMIX_NAMESPACE, Slurm's SLURM_JOB_ID.SLURM_STEP_ID. Each value
// is prefixed with its variable's name. "" when none is set.
func JobIDFromEnv() string { return jobIDFromEnv(os.LookupEnv) }

func jobIDFromEnv(lookup func(string) (string, bool)) string {
	if v, ok := lookup(EnvJobID); ok && v != "" {
		return EnvJobID + "=" + v
	}
	for _, name := range jobIDVars {
		v, ok := lookup(name)
		if !ok || v == "" {
			continue
		}
		id := name + "=" + v
		switch name {
		case "TORCHELASTIC_RUN_ID":
			addr, _ := lookup("MASTER_ADDR")
			port, _ := lookup("MASTER_PORT")
			id += "@" + addr + ":" + port
		case "SLURM_JOB_ID":
			step, _ := lookup("SLURM_STEP_ID")
			id += "." + step
		}
		return id
	}
	return ""
}
