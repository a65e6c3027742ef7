package gloo_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestMpirun starts the conformance role with OpenMPI's mpirun instead of the harness: the
// ranks learn their place from OMPI_COMM_WORLD_* and the store from CPCACHE_STORE.
func TestMpirun(t *testing.T) {
	mpirun, err := exec.LookPath("mpirun")
	if err != nil {
		t.Skip("mpirun not installed (make deps installs openmpi-bin): ", err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4",
		"--mca", "btl", "self,tcp", exe, "-test.run=^$")
	cmd.Env = append(withoutLauncherEnv(os.Environ()),
		"CPCACHE_MULTIPROC_ROLE=conformance", "CPCACHE_STORE="+fileStore(t), "CPCACHE_TEST_SOAK=8", "CPCACHE_TEST_WORLD=4")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun: %v\n%s", err, out)
	}
}

// withoutLauncherEnv drops torchrun-style variables, so that the ranks read OpenMPI's.
func withoutLauncherEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CPCACHE_MULTIPROC_ROLE", "CPCACHE_ENV_SOURCE":
			continue
		}
		out = append(out, kv)
	}
	return out
}
