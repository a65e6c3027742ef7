package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
)

// LibrarySearch describes where a run-time loaded library is looked for. It is shared with
// package nccl.
type LibrarySearch struct {
	// Env names an environment variable holding an explicit path. When it is set, that path
	// is the only candidate: an explicit override that does not load is an error, not a hint.
	Env string
	// Sonames are tried as bare names first, so the dynamic linker's own search applies
	// (LD_LIBRARY_PATH, the ld.so cache, RUNPATH).
	Sonames []string
	// Dirs are well-known directories; each soname inside each existing directory is tried.
	Dirs []string
	// Globs match further files, e.g. Python wheel layouts
	// ".../site-packages/nvidia/nccl/lib/libnccl.so.2"; matches are tried in sorted order.
	Globs []string
}

// Candidates returns the paths to try, in order, without duplicates. Directory and glob
// entries are included only when the file exists.
func (s LibrarySearch) Candidates() []string {
	if s.Env != "" {
		if p := os.Getenv(s.Env); p != "" {
			return []string{p}
		}
	}
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		if p != "" && !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, n := range s.Sonames {
		add(n)
	}
	for _, d := range s.Dirs {
		if d == "" {
			continue
		}
		for _, n := range s.Sonames {
			p := filepath.Join(d, n)
			if fileExists(p) {
				add(p)
			}
		}
	}
	for _, g := range s.Globs {
		matches, _ := filepath.Glob(g) // only ErrBadPattern, impossible for our patterns
		for _, m := range matches {
			if fileExists(m) {
				add(m)
			}
		}
	}
	return out
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// PythonLibGlobs returns glob patterns for a library shipped in a Python wheel under
// site-packages/<rel> (e.g. rel "nvidia/nccl/lib/libnccl.so.2"), in the order Python would
// import the package: PYTHONPATH entries, the active virtualenv or conda prefix, the prefix
// of the python3 first on PATH (a venv or conda python need not be activated), the user site
// and the system prefixes. No process is started: this is pure path arithmetic.
func PythonLibGlobs(rel string) []string {
	var out []string
	for _, d := range filepath.SplitList(os.Getenv("PYTHONPATH")) {
		if d != "" {
			out = append(out, filepath.Join(d, rel))
		}
	}
	var prefixes []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if v := os.Getenv(env); v != "" {
			prefixes = append(prefixes, v)
		}
	}
	if exe, err := exec.LookPath("python3"); err == nil {
		if abs, err := filepath.Abs(exe); err == nil {
			prefixes = append(prefixes, filepath.Dir(filepath.Dir(abs))) // <prefix>/bin/python3
		}
	}
	if h, err := os.UserHomeDir(); err == nil {
		prefixes = append(prefixes, filepath.Join(h, ".local"))
	}
	prefixes = append(prefixes, "/usr/local", "/usr", "/opt/conda")
	seen := map[string]bool{}
	for _, p := range prefixes {
		if seen[p] {
			continue
		}
		seen[p] = true
		for _, site := range []string{"site-packages", "dist-packages"} {
			out = append(out, filepath.Join(p, "lib", "python3*", site, rel))
		}
	}
	out = append(out, filepath.Join("/usr/lib/python3/dist-packages", rel))
	return out
}

// cudaSearch is where libcuda.so.1 is looked for. The driver library belongs to the kernel
// driver, so no wheel layout applies; the CUDA toolkit's stubs directory is deliberately
// absent (its libcuda only returns CUDA_ERROR_STUB_LIBRARY).
func cudaSearch() LibrarySearch {
	return LibrarySearch{
		Env:     "CPCACHE_CUDA_LIBRARY",
		Sonames: []string{"libcuda.so.1", "libcuda.so"},
		Dirs: []string{
			"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
			"/usr/local/nvidia/lib64", "/usr/lib/wsl/lib",
		},
	}
}
