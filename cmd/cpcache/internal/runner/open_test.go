package runner

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/cpcache/cpcache/gloo"
	"github.com/cpcache/cpcache/job"
)

// TestOpenErrorNamesTheJobsInput: what job.Open refuses because of the job's input is a bad
// input (exit status 2) naming the flag, with job's own words kept once; a failure of the run
// itself stays what it is.
func TestOpenErrorNamesTheJobsInput(t *testing.T) {
	mismatch := fmt.Errorf("%w: ranks disagree on the storage (different storage MAC keys): a storage with MAC key fingerprint aa on rank 0, a storage with MAC key fingerprint bb on rank 1", job.ErrMismatch)
	for _, c := range []struct {
		name   string
		err    error
		bad    bool
		starts string
	}{
		{"store in use", fmt.Errorf("gloo: %w", gloo.ErrStoreInUse), true, "runner: bad input: --store: "},
		{"storage mismatch", mismatch, true, "runner: bad input: --storage, --storage-key-file: job: ranks disagree"},
		{"bad value", fmt.Errorf("%w: layout world 8, job 4", job.ErrBadValue), true, "runner: bad input: job: bad configuration value"},
		{"lost peer", io.ErrUnexpectedEOF, false, io.ErrUnexpectedEOF.Error()},
	} {
		got := openError(c.err)
		assert.Equal(t, c.bad, errors.Is(got, ErrBadInput), c.name)
		assert.ErrorIs(t, got, c.err, c.name)
		assert.Contains(t, got.Error(), c.starts, c.name)
	}
	assert.Equal(t, 1, strings.Count(openError(mismatch).Error(), "ranks disagree on the storage"), "job's words appear once")
}
