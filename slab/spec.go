package slab

import (
	"fmt"
	"math"
	"regexp"
)

// Backend is the kind of memory a slab lives in.
type Backend string

const (
	// Host is host shared memory: an anonymous segment (memfd) shared with the group's
	// ranks on this host over a Unix socket, optionally registered with CUDA as pinned memory.
	Host Backend = "host"
	// CUDAIPC is device memory exported with a CUDA IPC handle and opened by peers on the same
	// node. It needs a DeviceBackend (Spec.DeviceBackend).
	CUDAIPC Backend = "cuda-ipc"
)

// Spec describes the slab every rank creates. Backend, PageSize, Pages and Layout must be
// equal on every rank of the group; Device, PinHost, Tag, DeviceBackend and Pinner are
// local choices. The device memory and pinning a set uses travel in its Spec (slab/cudaslab
// fills them in: cudaslab.Backend.Spec), so that two sets of one process may use different
// ones and a set never uses memory its caller did not name.
type Spec struct {
	Backend  Backend
	PageSize int    // bytes per page, > 0
	Pages    int    // pages per slab, > 0
	Layout   string // the page layout (dtype, layers, heads, ...), compared verbatim
	Device   int    // CUDAIPC: this rank's CUDA device ordinal
	PinHost  bool   // Host: register every slab with CUDA as pinned memory (needs Pinner)
	Tag      string // Host: [A-Za-z0-9_-]{0,32}, part of segment names (to find leftovers)
	// DeviceBackend allocates and opens the device slabs of a CUDAIPC set (required there).
	DeviceBackend DeviceBackend
	// Pinner registers the slabs of a Host set with PinHost (required with PinHost).
	Pinner HostPinner
}

var tagRE = regexp.MustCompile(`^[A-Za-z0-9_-]{0,32}$`)

// Bytes is the size of one slab.
func (s Spec) Bytes() int { return s.PageSize * s.Pages }

// validate checks the spec on its own, before any collective.
func (s Spec) validate() error {
	switch s.Backend {
	case Host, CUDAIPC:
	default:
		return fmt.Errorf("%w: backend %q (want %q or %q)", ErrBadArgument, s.Backend, Host, CUDAIPC)
	}
	if s.PageSize <= 0 || s.Pages <= 0 {
		return fmt.Errorf("%w: page size %d, pages %d (both must be positive)", ErrBadArgument, s.PageSize, s.Pages)
	}
	if s.Pages > math.MaxInt32 || s.PageSize > math.MaxInt/s.Pages {
		return fmt.Errorf("%w: %d pages of %d bytes overflow", ErrBadArgument, s.Pages, s.PageSize)
	}
	if s.PinHost && s.Pinner == nil {
		return fmt.Errorf("%w: Spec.PinHost is set but Spec.Pinner is nil (pinned host slabs need a HostPinner, e.g. from slab/cudaslab)", ErrBadArgument)
	}
	if !tagRE.MatchString(s.Tag) {
		return fmt.Errorf("%w: tag %q (want [A-Za-z0-9_-], at most 32 characters)", ErrBadArgument, s.Tag)
	}
	return nil
}

// shared is the part of a Spec every rank must agree on.
type shared struct {
	Backend  Backend `json:"backend"`
	PageSize int     `json:"page_size"`
	Pages    int     `json:"pages"`
	Layout   string  `json:"layout"`
}

func (s Spec) shared() shared {
	return shared{Backend: s.Backend, PageSize: s.PageSize, Pages: s.Pages, Layout: s.Layout}
}

// diff lists the fields of x that differ from ref, naming both values.
func (x shared) diff(ref shared) string {
	out := ""
	add := func(f string, a, b any) {
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("%s %v (majority %v)", f, a, b)
	}
	if x.Backend != ref.Backend {
		add("backend", fmt.Sprintf("%q", x.Backend), fmt.Sprintf("%q", ref.Backend))
	}
	if x.PageSize != ref.PageSize {
		add("page size", x.PageSize, ref.PageSize)
	}
	if x.Pages != ref.Pages {
		add("pages", x.Pages, ref.Pages)
	}
	if x.Layout != ref.Layout {
		add("layout", fmt.Sprintf("%q", x.Layout), fmt.Sprintf("%q", ref.Layout))
	}
	return out
}
