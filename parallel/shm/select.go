package shm

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/cpcache/cpcache/parallel"
)

// EnvBackend is the environment variable that chooses the consensus backend for Consensus:
// "auto" (or unset: shared memory when every member is on one host, else the bootstrap
// group), "shm" (shared memory or an error) or "gloo" (always the bootstrap group, which is
// the Gloo group in production; for comparisons).
const EnvBackend = "CPCACHE_CONSENSUS_BACKEND"

const (
	modeAuto = "auto"
	modeShm  = "shm"
	modeGloo = "gloo"
)

// Backends Consensus reports.
const (
	BackendShm       = "shm"       // a shared-memory Group
	BackendBootstrap = "bootstrap" // the bootstrap group itself
)

// Consensus returns the group to run consensus collectives on, over the members of boot:
// a shared-memory Group when the members are all on one host (and the backend is not
// forced to "gloo"), else boot itself behind a wrapper whose Close does nothing. Either
// way the caller closes the returned group and, after it, boot. backend is BackendShm or
// BackendBootstrap. It is collective; every member must choose the same backend setting
// (Options.Backend, else $CPCACHE_CONSENSUS_BACKEND), or all fail.
func Consensus(ctx context.Context, boot parallel.Group, opts Options) (g parallel.Group, backend string, err error) {
	mode := opts.Backend
	if mode == "" {
		mode = strings.TrimSpace(os.Getenv(EnvBackend))
	}
	if mode == "" {
		mode = modeAuto
	}
	switch mode {
	case modeAuto, modeShm, modeGloo:
	default:
		// Unknown on this member: still take part in the exchange so that the others fail
		// with this error instead of waiting for us.
		if boot != nil {
			boot.AllGather(ctx, hello{mode: mode, err: fmt.Sprintf("%s %q", unknownBackendHello, mode)}.encode())
		}
		return nil, "", fmt.Errorf("%w %q (from Options.Backend or %s): want auto, shm or gloo", ErrUnknownBackend, mode, EnvBackend)
	}
	sg, fallback, err := create(ctx, boot, opts, mode)
	if err != nil {
		return nil, "", err
	}
	if fallback != nil {
		return borrowed{boot}, BackendBootstrap, nil
	}
	return sg, BackendShm, nil
}

// borrowed is a group the caller does not own through this handle: Close does nothing.
type borrowed struct{ parallel.Group }

func (borrowed) Close() error { return nil }
