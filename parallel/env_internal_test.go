package parallel

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func lookupMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestFromEnvSources(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want Env
	}{
		{"none", map[string]string{}, Env{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}},
		{"torchrun", map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
			Env{Rank: 3, WorldSize: 8, LocalRank: 3, LocalWorldSize: 4, MasterAddr: "10.0.0.1", MasterPort: 29500, Source: "torchrun"}},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "5", "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "CPCACHE_STORE": "redis://h:1"},
			Env{Rank: 5, WorldSize: 16, LocalRank: 5, LocalWorldSize: 8, Store: "redis://h:1", Source: "openmpi"}},
		{"slurm", map[string]string{"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "8(x2)"},
			Env{Rank: 9, WorldSize: 16, LocalRank: 1, LocalWorldSize: 8, Source: "slurm"}},
		// srun sets SLURM_NTASKS_PER_NODE only for --ntasks-per-node; the step's per-node
		// list, indexed by SLURM_NODEID, gives the local size otherwise (not the world size,
		// which would make a multi-node job look like one node).
		{"slurm, two nodes, no --ntasks-per-node", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
			"SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_TASKS_PER_NODE": "8"},
			Env{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, Source: "slurm"}},
		{"slurm, uneven nodes", map[string]string{"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "3,2"},
			Env{Rank: 4, WorldSize: 5, LocalRank: 1, LocalWorldSize: 2, Source: "slurm"}},
		{"slurm, job's list only", map[string]string{"SLURM_PROCID": "2", "SLURM_NTASKS": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "1,2(x2),1"},
			Env{Rank: 2, WorldSize: 6, LocalRank: 0, LocalWorldSize: 2, Source: "slurm"}},
		{"torchrun wins, openmpi agrees", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
			Env{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, Source: "torchrun"}},
		// mpirun in an sbatch script: every rank inherits the batch step's SLURM_PROCID=0.
		{"mpirun inside a Slurm allocation", map[string]string{"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
			"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "1"},
			Env{Rank: 3, WorldSize: 8, LocalRank: 3, LocalWorldSize: 8, Source: "openmpi"}},
		// srun torchrun: one Slurm task per node, torchrun's ranks within; a bad inherited
		// Slurm value is not this process's business either.
		{"torchrun under srun", map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
			"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "(x2"},
			Env{Rank: 5, WorldSize: 8, LocalRank: 1, LocalWorldSize: 4, Source: "torchrun"}},
		{"forced slurm ignores disagreeing torchrun", map[string]string{"CPCACHE_ENV_SOURCE": "slurm", "RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "2", "SLURM_NTASKS": "4"},
			Env{Rank: 2, WorldSize: 4, LocalRank: 2, LocalWorldSize: 4, Source: "slurm"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := fromEnv(lookupMap(c.env))
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestFromEnvErrorsNameVariables(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"RANK": "8", "WORLD_SIZE": "8"}, "RANK=8 is not below WORLD_SIZE=8"},
		{map[string]string{"RANK": "x", "WORLD_SIZE": "8"}, `RANK="x" is not an integer`},
		{map[string]string{"RANK": "0"}, "RANK is set but WORLD_SIZE is not"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be positive"},
		{map[string]string{"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"},
			"launchers disagree: RANK=1 WORLD_SIZE=4 but OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4"},
		{map[string]string{"CPCACHE_ENV_SOURCE": "pbs"}, `CPCACHE_ENV_SOURCE="pbs"`},
		{map[string]string{"CPCACHE_ENV_SOURCE": "slurm"}, "CPCACHE_ENV_SOURCE=slurm but its variables are not set"},
		{map[string]string{"MASTER_PORT": "http"}, `MASTER_PORT="http" is not a port`},
		// A launcher variable that is present but empty is named with its (empty) value.
		{map[string]string{"RANK": "", "WORLD_SIZE": "8"}, `RANK="" is not an integer`},
		{map[string]string{"RANK": "1", "WORLD_SIZE": ""}, `WORLD_SIZE="" is not an integer`},
		{map[string]string{"RANK": "1", "WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": ""}, `OMPI_COMM_WORLD_RANK="" is not an integer`},
		{map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "(x2)"}, `SLURM_NTASKS_PER_NODE="(x2)": "" is not an integer`},
		{map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2", "SLURM_NODEID": "0"}, `SLURM_STEP_TASKS_PER_NODE="2(x2": bad repeat`},
		{map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "one"}, `SLURM_NODEID="one" is not a node index`},
		{map[string]string{"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "0"}, "SLURM_LOCALID=2 is not below SLURM_STEP_TASKS_PER_NODE=2"},
	}
	for _, c := range cases {
		_, err := fromEnv(lookupMap(c.env))
		require.Error(t, err, "%v", c.env)
		assert.ErrorIs(t, err, ErrBadEnv)
		assert.Contains(t, err.Error(), c.want)
	}
}

func TestLauncherVarsCoverEveryPlacementVariable(t *testing.T) {
	// With every launcher variable removed, FromEnv sees a single-rank process again.
	env := map[string]string{
		"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
		"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
		"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2",
		"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0",
		EnvSourceVar: "slurm", "CPCACHE_STORE": "file:///tmp/x", EnvJobID: "j",
	}
	vars := LauncherVars()
	assert.Len(t, vars, len(env))
	for _, v := range vars {
		assert.Contains(t, env, v)
		delete(env, v)
	}
	e, err := fromEnv(lookupMap(env))
	require.NoError(t, err)
	assert.Equal(t, Env{Rank: 0, WorldSize: 1, LocalRank: 0, LocalWorldSize: 1, Source: "single"}, e)
}

// TestJobIDFromEnv: the job id every rank of a job shares, from CPCACHE_JOB_ID or the
// launcher's own variables, each prefixed with its variable (so ids of different launchers
// never collide); torchrun's adds the master address (its default run id is "none" for
// every job), Slurm's the step.
func TestJobIDFromEnv(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, ""},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, ""},
		{map[string]string{"CPCACHE_JOB_ID": "j1", "OMPI_MCA_orte_ess_jobid": "123"}, "CPCACHE_JOB_ID=j1"},
		{map[string]string{"CPCACHE_JOB_ID": "", "OMPI_MCA_orte_ess_jobid": "123"}, "OMPI_MCA_orte_ess_jobid=123"},
		{map[string]string{"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}, "TORCHELASTIC_RUN_ID=none@h:29500"},
		{map[string]string{"PMIX_NAMESPACE": "prterun-h-1@1"}, "PMIX_NAMESPACE=prterun-h-1@1"},
		{map[string]string{"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "2"}, "SLURM_JOB_ID=77.2"},
		// mpirun inside an allocation: its own job id, not the allocation's.
		{map[string]string{"SLURM_JOB_ID": "77", "OMPI_MCA_orte_ess_jobid": "123"}, "OMPI_MCA_orte_ess_jobid=123"},
	} {
		assert.Equal(t, c.want, jobIDFromEnv(lookupMap(c.env)), "env %v", c.env)
	}
}

// TestUnderLauncher: torchrun-style and OpenMPI variables say a launcher started this
// process; Slurm's alone describe the allocation a command run by hand sees too.
func TestUnderLauncher(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, false},
		{map[string]string{"RANK": "0"}, true},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "1"}, true},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, false},
		{map[string]string{"SLURM_PROCID": "0", "OMPI_COMM_WORLD_RANK": "0"}, true},
		{map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "h"}, false},
	} {
		assert.Equal(t, c.want, underLauncher(lookupMap(c.env)), "env %v", c.env)
	}
}
