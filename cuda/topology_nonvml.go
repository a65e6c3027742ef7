//go:build cpcache_nonvml

package cuda

import "fmt"

// QueryTopology, built with the cpcache_nonvml tag (libcpcache: go-nvml leaves hundreds of
// undefined nvml* symbols in a c-shared library, which RTLD_NOW loaders such as ctypes and
// executables linked with -lcpcache refuse), always returns ErrNVMLUnavailable.
func QueryTopology() (*Topology, error) {
	return nil, fmt.Errorf("%w: built without NVML (tag cpcache_nonvml)", ErrNVMLUnavailable)
}
