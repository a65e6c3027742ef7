package shmseg

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Create creates path exclusively with mode 0600, sizes it to size bytes and maps it shared
// read-write. With reserve, the memory is allocated now (fallocate, where the file system
// supports it), so that a full /dev/shm fails here instead of raising SIGBUS at a later
// write to a sparse page. On failure the file is removed.
func Create(path string, size int, reserve bool) (mem []byte, err error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create segment %s: %w", path, err)
	}
	defer unix.Close(fd)
	defer func() {
		if err != nil {
			unix.Unlink(path)
		}
	}()
	// The umask can only remove bits; make sure the owner keeps 0600 and no group/other bit survives.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return nil, fmt.Errorf("chmod segment %s: %w", path, err)
	}
	sized := false
	if reserve {
		err := unix.Fallocate(fd, 0, 0, int64(size))
		if err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return nil, fmt.Errorf("allocate %d bytes for segment %s: %w", size, path, err)
		}
		sized = err == nil
	}
	if !sized {
		if err := unix.Ftruncate(fd, int64(size)); err != nil {
			return nil, fmt.Errorf("size segment %s to %d bytes: %w", path, size, err)
		}
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map segment %s (%d bytes): %w", path, size, err)
	}
	return mem, nil
}

// Open opens path (not following a symlink), passes its stat to check, whose error it
// returns as is, and maps size bytes of it shared read-write.
func Open(path string, size int, check func(st *unix.Stat_t) error) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat segment %s: %w", path, err)
	}
	if err := check(&st); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map segment %s (%d bytes): %w", path, size, err)
	}
	return mem, nil
}

// Unlink removes path; mappings stay valid. A missing name is not an error.
func Unlink(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("unlink segment %s: %w", path, err)
	}
	return nil
}
