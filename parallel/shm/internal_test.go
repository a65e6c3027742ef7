package shm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestCreateSegmentIsAnonymousUniqueAndChecked(t *testing.T) {
	ctx := context.Background()
	l := newLayout(4, 256)
	seg, err := createSegment(l)
	require.NoError(t, err)
	defer seg.Unshare()
	defer unix.Munmap(seg.Mem)
	assert.Equal(t, l.total, len(seg.Mem))
	seg2, err := createSegment(l)
	require.NoError(t, err)
	defer seg2.Unshare()
	defer unix.Munmap(seg2.Mem)
	assert.NotEqual(t, seg.Handle, seg2.Handle)
	m, _ := filepath.Glob(filepath.Join(DefaultDir, segmentPrefix+"*"))
	assert.Empty(t, m, "a segment must have no name in %s", DefaultDir)

	peer, err := openSegment(ctx, seg.Handle, l)
	require.NoError(t, err)
	unix.Munmap(peer)

	_, err = openSegment(ctx, seg.Handle, newLayout(5, 256))
	assert.ErrorContains(t, err, "bytes", "a different group size is a different size")
	// A well-formed handle that nobody serves fails, naming it.
	_, err = openSegment(ctx, "@"+segmentPrefix+"00112233445566778899aabbccddeeff-00", l)
	assert.ErrorContains(t, err, "00112233445566778899aabbccddeeff")
	_, err = openSegment(ctx, "/dev/shm/stranger", l)
	assert.ErrorContains(t, err, "not a segment handle")

	require.NoError(t, seg.Unshare())
	require.NoError(t, seg.Unshare(), "unsharing twice is fine")
	_, err = openSegment(ctx, seg.Handle, l)
	assert.ErrorContains(t, err, seg.Handle, "an unshared segment can no longer be opened")
}

func TestExitedPeerDetectedBeforeReaping(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	p := watchPeer(cmd.Process.Pid)
	defer p.close()
	assert.False(t, p.exited())
	require.NoError(t, cmd.Process.Kill())
	// Not reaped yet: a zombie, which kill(pid, 0) would still call alive.
	deadline := time.Now().Add(10 * time.Second)
	for !p.exited() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	assert.True(t, p.exited())
	cmd.Wait()
	assert.False(t, watchPeer(os.Getpid()).exited(), "this process is never reported dead")
}

func TestAbortReasonsDecode(t *testing.T) {
	g := &Group{rank: 1, ranks: []int{8, 9, 10}}
	enc := func(code, reporter, culprit int) uint64 {
		return uint64(code)<<56 | uint64(reporter)<<32 | uint64(uint32(culprit+1))
	}
	assert.EqualError(t, g.abortErr(enc(abortTimeout, 0, 2)),
		"parallel: collective timed out: member 0 (global rank 8) timed out waiting for member 2 (global rank 10)")
	assert.EqualError(t, g.abortErr(enc(abortExited, 1, 2)),
		"parallel: peer lost: member 2 (global rank 10) exited (reported by member 1 (global rank 9))")
	assert.EqualError(t, g.abortErr(enc(abortFailed, 2, -1)),
		"parallel: peer lost: member 2 (global rank 10) abandoned the group after an error")
	assert.EqualError(t, g.abortErr(enc(abortTimeout, 0, -1)),
		"parallel: collective timed out: member 0 (global rank 8) timed out waiting for a member")
}

func TestHelloRoundTrip(t *testing.T) {
	h := localHello("auto", os.TempDir())
	require.Empty(t, h.err)
	require.Empty(t, h.idErr)
	got, err := decodeHello(h.encode())
	require.NoError(t, err)
	assert.Equal(t, h, got)
	_, err = decodeHello([]byte("garbage"))
	assert.ErrorContains(t, err, "not a shm hello")
	other := h
	other.boot = "another-boot"
	err = sameHost([]hello{h, h, other})
	assert.ErrorIs(t, err, ErrNotLocal)
	assert.ErrorContains(t, err, "member 2 has boot=another-boot")
	assert.NoError(t, sameHost([]hello{h, h}))
	lost := h
	lost.idErr = "boot id: permission denied"
	got, err = decodeHello(lost.encode())
	require.NoError(t, err)
	assert.Equal(t, lost, got)
}
