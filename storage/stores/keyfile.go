package stores

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/cpcache/cpcache/internal/regfile"
	"github.com/cpcache/cpcache/storage"
)

// EnvKeyFile names the environment variable that Open reads the MAC key file from when
// Options carry no key (see Options.MACKey).
const EnvKeyFile = "CPCACHE_STORAGE_KEY_FILE"

// DirKeyFile is the name of the key file a file store keeps in its directory, created with
// a random key (mode 0600) by the first Open that needs it.
const DirKeyFile = ".cpcache-storage-key"

const (
	minKeySize     = 16   // bytes of key material (after trimming a key file's white space)
	maxKeyFileSize = 4096 // a key file is read whole; a larger one is not a key
)

// ReadKeyFile reads a MAC key: the file's bytes without leading and trailing white space
// (`openssl rand -hex 32 > FILE` makes one). It refuses a file that is not a regular file,
// is owned by another user (other than root), can be read or written by group or others,
// or holds fewer than 16 bytes. Errors name the file, never its contents.
func ReadKeyFile(path string) ([]byte, error) { return readKeyFile(path, false) }

// readKeyFile is ReadKeyFile; with noFollow a key file that is a symbolic link is refused
// (a file store's own key file, in a directory others may write: the link's target could
// be a file whose contents its maker knows).
func readKeyFile(path string, noFollow bool) ([]byte, error) {
	bad := func(kind error, format string, args ...any) error {
		return &storage.OpError{Backend: "key", Where: path, Op: "read", Kind: kind, Err: fmt.Errorf(format, args...)}
	}
	flags := 0
	if noFollow {
		flags = syscall.O_NOFOLLOW
	}
	f, fi, err := regfile.OpenFile(path, os.O_RDONLY|flags, 0)
	if noFollow && errors.Is(err, syscall.ELOOP) {
		return nil, bad(storage.ErrBadArgument, "a symbolic link (not followed): the store's own key file must be a regular file")
	}
	if errors.Is(err, regfile.ErrNotRegular) {
		return nil, bad(storage.ErrBadArgument, "not a regular file (%s)", regfile.Kind(fi.Mode()))
	}
	if err != nil {
		return nil, bad(storage.ErrBadArgument, "%w", unwrapPath(err))
	}
	defer f.Close()
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, bad(storage.ErrBadArgument, "mode %#o lets group or others read or write it (chmod 600 %s)", perm, path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != uint32(os.Geteuid()) && st.Uid != 0 {
		return nil, bad(storage.ErrBadArgument, "owned by uid %d, not by this user (uid %d) or root", st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileSize+1))
	if err != nil {
		return nil, bad(nil, "%w", unwrapPath(err))
	}
	if len(b) > maxKeyFileSize {
		return nil, bad(storage.ErrBadArgument, "larger than %d bytes: not a key file", maxKeyFileSize)
	}
	key := bytes.TrimSpace(b)
	if len(key) < minKeySize {
		return nil, bad(storage.ErrBadArgument, "holds %d bytes of key, want at least %d (make one with: openssl rand -hex 32 > %s; chmod 600 %s)",
			len(key), minKeySize, path, path)
	}
	return key, nil
}

// LoadOrCreateKeyFile reads the MAC key file at path (ReadKeyFile), first creating it with
// a random 256-bit key (64 hex digits, mode 0600) if it does not exist. Concurrent callers,
// on one host or several sharing a filesystem, all end up with the same key: the file is
// written under a temporary name and linked into place, and only the first link wins.
func LoadOrCreateKeyFile(path string) ([]byte, error) { return loadOrCreateKeyFile(path, false) }

// loadOrCreateKeyFile is LoadOrCreateKeyFile; noFollow is readKeyFile's.
func loadOrCreateKeyFile(path string, noFollow bool) ([]byte, error) {
	key, err := readKeyFile(path, noFollow)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	fail := func(err error) ([]byte, error) {
		return nil, &storage.OpError{Backend: "key", Where: path, Op: "create", Err: unwrapPath(err)}
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-key-")
	if err != nil {
		return fail(err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	var raw [32]byte
	rand.Read(raw[:])
	text := hex.AppendEncode(nil, raw[:])
	_, err = f.Write(append(text, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fail(err)
	}
	return readKeyFile(path, noFollow)
}

// unwrapPath drops the *PathError wrapper whose path the OpError already names.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	return err
}

// newMAC makes the MAC of every store opened (storage.NewMAC: the payload MAC this CPU
// computes fastest); tests replace it to run a backend under each algorithm (SetMACAlg).
var newMAC = storage.NewMAC

// explicitKey returns the authenticator of the key that opts name (MACKey, MACKeyFile or
// $CPCACHE_STORAGE_KEY_FILE), or nil if they name none.
func explicitKey(opts options) (*storage.MAC, error) {
	switch {
	case len(opts.MACKey) > 0:
		if len(opts.MACKey) < minKeySize {
			return nil, &storage.OpError{Backend: "key", Op: "open", Kind: storage.ErrBadArgument,
				Err: fmt.Errorf("MAC key of %d bytes is too short (want at least %d)", len(opts.MACKey), minKeySize)}
		}
		return newMAC(opts.MACKey), nil
	case opts.MACKeyFile != "":
		return readKeyAuthenticator(opts.MACKeyFile)
	case os.Getenv(EnvKeyFile) != "":
		return readKeyAuthenticator(os.Getenv(EnvKeyFile))
	}
	return nil, nil
}

func readKeyAuthenticator(path string) (*storage.MAC, error) {
	key, err := ReadKeyFile(path)
	if err != nil {
		return nil, err
	}
	return newMAC(key), nil
}

// errNoKey is the refusal to open the Redis store at addr without a MAC key.
func errNoKey(addr string) error {
	return &storage.OpError{Backend: "redis", Where: addr, Op: "open", Kind: storage.ErrBadArgument, Err: storage.KindCause(storage.ErrNoKey, errors.New(
		"a shared Redis needs a MAC key so that whoever can write to it cannot inject pages: "+
			"name a key file (mode 0600, e.g. from `openssl rand -hex 32`) in $"+EnvKeyFile+" or Options.MACKeyFile, "+
			"or accept unauthenticated pages with Options.Insecure"))}
}
