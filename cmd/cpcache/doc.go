// Command cpcache runs cpcache's multi-rank jobs and tools. See `cpcache --help`.
//
// Subcommands, one file each, register themselves from init: run (the main job: serve a
// workload through the cache on a world of ranks and report), launch (start N local ranks
// of a command with torchrun-style variables and a rendezvous store), layout (print the
// process groups of a parallel layout), collective-bench (time the small collectives),
// gpu-info (CUDA driver, NCCL, devices, topology), cleanup (remove the temporary
// directories of crashed jobs) and version. run makes its flags a runner.Config
// (package cmd/cpcache/internal/runner) and runs this process as one rank of it.
//
// Contract: every subcommand returns the process's exit status: 0 success, 1 failure, 2 bad
// usage or input (reported before any rank starts). Errors go to stderr as
// "cpcache: <subcommand>: ...".
//
// Ownership: each subcommand owns what it starts (rank processes, groups, files in its
// temporary directory) and stops or removes it before returning. What it cannot stop when
// killed goes anyway: ranks die with their launcher (Pdeathsig), and a janitor process
// removes the launcher's temporary directory (jobdir.go); at most 256 local ranks are
// started (limits.go). SIGINT and SIGTERM end run and launch with 128+signal.
//
// Usage loop: `cpcache run` (or `mpirun -n N cpcache run`, each rank joining the job from its
// launcher's environment), then read the report on stdout.
package main
