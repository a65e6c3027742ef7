package shm

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCreateSegmentIsPrivateUniqueAndChecked(t *testing.T) {
	old := syscall.Umask(0) // a permissive umask must not widen the mode
	defer syscall.Umask(old)
	dir := t.TempDir()
	l := newLayout(4, 256)
	path, mem, err := createSegment(dir, l)
	require.NoError(t, err)
	defer syscall.Munmap(mem)
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Equal(t, int64(l.total), st.Size())

	path2, mem2, err := createSegment(dir, l)
	require.NoError(t, err)
	syscall.Munmap(mem2)
	assert.NotEqual(t, path, path2)

	peer, err := openSegment(path, l)
	require.NoError(t, err)
	syscall.Munmap(peer)

	_, err = openSegment(path, newLayout(5, 256))
	assert.ErrorContains(t, err, "bytes, want", "a different group size is a different size")
	_, err = openSegment(path2, l)
	require.NoError(t, err)
	// A segment renamed to another valid name fails the nonce check.
	other := filepath.Join(dir, segmentPrefix+"00112233445566778899aabbccddeeff")
	require.NoError(t, os.Rename(path2, other))
	_, err = openSegment(other, l)
	assert.ErrorContains(t, err, "nonce")
	_, err = openSegment(filepath.Join(dir, "stranger"), l)
	assert.ErrorContains(t, err, "not a segment name")

	require.NoError(t, unlinkSegment(path))
	require.NoError(t, unlinkSegment(path), "unlinking twice is fine")
	_, err = os.Stat(path)
	assert.True(t, os.IsNotExist(err))
}

func TestCreateSegmentNamesBadDirectory(t *testing.T) {
	_, _, err := createSegment("/nonexistent-dir-for-shm-test", newLayout(2, 64))
	assert.ErrorContains(t, err, "/nonexistent-dir-for-shm-test")
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
}
