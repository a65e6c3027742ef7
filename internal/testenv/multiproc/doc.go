// Package multiproc runs a test binary's own functions as separate processes ("ranks"), so
// that multi-process code is tested with real processes and no extra binaries.
//
// In the package's TestMain call Main(m) first; register role functions with Register at
// package init; a test calls Run to start N copies of the test binary that each run one role
// with torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) set.
//
// Contract: every rank is a separate process with its own process group, started with the
// parent's environment plus Spec.Env and Spec.RankEnv; Run fails the test naming each rank
// that exited non-zero, with its output; Start leaves the judging to the caller. A role may
// hand data back with Report; it arrives in that rank's Result.Report. Ranks still
// running at Spec.Timeout are killed with SIGKILL (their whole process group).
//
// Ownership: the rank processes belong to the Run or Start call; nothing outlives the wait.
//
// Usage loop:
//
//	func TestMain(m *testing.M) { multiproc.Main(m) }
//	func init() { multiproc.Register("role", roleFn) }
//	func TestX(t *testing.T) { multiproc.Run(t, multiproc.Spec{Role: "role", N: 4}) }
package multiproc
