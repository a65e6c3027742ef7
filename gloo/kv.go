package gloo

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cpcache/cpcache/internal/regfile"
)

// kv is a rendezvous store's backend: the directory of a file:// store or the server of a
// redis:// one. Every call is bounded by its context; implementations are safe for
// concurrent use.
type kv interface {
	// put creates or atomically replaces key (a reader sees the old value or the new one,
	// never a partial or missing one).
	put(ctx context.Context, key string, val []byte) error
	// create creates key only if it does not exist; it reports whether it did.
	create(ctx context.Context, key string, val []byte) (bool, error)
	// get returns key's value, or ok false when there is none.
	get(ctx context.Context, key string) (val []byte, ok bool, err error)
	// del removes keys (missing ones are not an error).
	del(ctx context.Context, keys ...string) error
	// claim takes the claim named key with val until expiry, unless a live claim (one
	// taken before and neither released nor expired) holds it: then it returns that
	// claim's value and taken false.
	claim(ctx context.Context, key string, val []byte, expiry time.Time) (taken bool, held []byte, err error)
	// claimed returns the live claim named key (ok false when none).
	claimed(ctx context.Context, key string) (val []byte, ok bool, err error)
	// release gives up the claim named key if val still holds it.
	release(ctx context.Context, key string, val []byte) error
	// reap removes what runs that ended long ago left under prefix: keys not written for
	// longer than age, temporary files of writers that died. The Redis backend's keys expire
	// by themselves (ttl), so it reaps nothing.
	// own is the reaper's job space (it holds its claim; other spaces with a live claim are
	// left alone).
	reap(ctx context.Context, prefix, own string, age time.Duration) error
	close() error
}

// claimExpired reports whether a claim value "<run> <size> <expiry unix ms> ..." has expired.
func claimExpired(val []byte, now time.Time) bool {
	f := strings.Fields(string(val))
	if len(f) < 3 {
		return true
	}
	ms, err := strconv.ParseInt(f[2], 10, 64)
	return err != nil || now.UnixMilli() >= ms
}

// ---- file:// ----

// fileKV keeps each key in a file of a directory tree: key "a/b/c" is the file a/b/c (each
// component escaped, see keyPath). Files are written under a temporary name in the key's
// directory and renamed (or linked, for create) into place, so a reader sees the old value
// or the new one, never a partial or missing one, and a store reused by run after run
// never fails on a key being replaced (cmd/libcpcache/ctest/reopen.c, in make capi-test,
// opens a cache 200 times in a row on one store). They are not fsynced: a key is read
// only by the processes of one run on live machines, and a file a machine crash left torn
// is one no later run reads (its run id is gone) or reads as expired (a claim). Every path is opened
// through an os.Root on the store directory, so a symbolic link in the store never leads
// outside it, and read only when it is a regular file (regfile): a named pipe a writer of the
// directory planted as a key is refused at once, not waited on forever.
type fileKV struct {
	root *os.Root
}

// tmpPrefix starts the name of every file being written; keyPath never produces it.
const tmpPrefix = ".tmp-"

// tmpAge is how long a temporary file may live before reap takes it for a dead writer's.
const tmpAge = time.Minute

func openFileKV(dir string) (*fileKV, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &fileKV{root: r}, nil
}

// keyPath maps a key to a relative path: each "/"-separated component keeps letters,
// digits, '_', '-' and (not first) '.', and escapes any other byte as %XX, so that no
// component is empty, ".", ".." or a temporary file's name.
func keyPath(key string) string {
	parts := strings.Split(key, "/")
	for i, p := range parts {
		var b strings.Builder
		for j := 0; j < len(p); j++ {
			c := p[j]
			if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' && j > 0 {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		}
		if b.Len() == 0 {
			b.WriteString("%")
		}
		parts[i] = b.String()
	}
	return strings.Join(parts, "/")
}

// writeTemp writes val to a new temporary file in dir (made if missing) and returns its name.
func (f *fileKV) writeTemp(dir string, val []byte) (string, error) {
	if err := f.root.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tmp := path.Join(dir, tmpPrefix+nonce())
	w, err := f.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, err = w.Write(val)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = f.root.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// retryGone runs op again when it failed because a directory it needed was removed under it
// (a concurrent del removing empty directories).
func retryGone(ctx context.Context, op func() error) error {
	for i := 0; ; i++ {
		err := op()
		if err == nil || !errors.Is(err, fs.ErrNotExist) || i == 5 || ctx.Err() != nil {
			return err
		}
	}
}

func (f *fileKV) put(ctx context.Context, key string, val []byte) error {
	p := keyPath(key)
	return retryGone(ctx, func() error {
		tmp, err := f.writeTemp(path.Dir(p), val)
		if err != nil {
			return err
		}
		if err := f.root.Rename(tmp, p); err != nil {
			_ = f.root.Remove(tmp)
			return err
		}
		return nil
	})
}

func (f *fileKV) create(ctx context.Context, key string, val []byte) (bool, error) {
	p := keyPath(key)
	created := false
	err := retryGone(ctx, func() error {
		tmp, err := f.writeTemp(path.Dir(p), val)
		if err != nil {
			return err
		}
		defer f.root.Remove(tmp)
		err = f.root.Link(tmp, p)
		if errors.Is(err, fs.ErrExist) {
			return nil
		}
		created = err == nil
		return err
	})
	return created, err
}

func (f *fileKV) get(ctx context.Context, key string) ([]byte, bool, error) {
	v, err := regfile.ReadFileIn(f.root, keyPath(key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, false, nil
		}
		return nil, false, err
	}
	return v, true, nil
}

func (f *fileKV) del(ctx context.Context, keys ...string) error {
	var errs []error
	for _, k := range keys {
		p := keyPath(k)
		if err := f.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		f.pruneDirs(path.Dir(p))
	}
	return errors.Join(errs...)
}

// pruneDirs removes dir and its parents while they are empty.
func (f *fileKV) pruneDirs(dir string) {
	for dir != "." && dir != "/" && dir != "" {
		if f.root.Remove(dir) != nil {
			return // not empty (or gone): leave it
		}
		dir = path.Dir(dir)
	}
}

// A file claim is a directory of generations: files named by a 20-digit number, the highest
// one the current claim. A claim is taken by creating the next generation (only one of two
// concurrent takers can), released by removing its file.
func claimGen(n uint64) string { return fmt.Sprintf("%020d", n) }

// claimHead returns the highest generation of the claim directory dir (0, nil: none).
func (f *fileKV) claimHead(dir string) (uint64, []string, error) {
	d, err := f.root.Open(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil, nil
		}
		return 0, nil, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return 0, nil, err
	}
	var gens []string
	var head uint64
	for _, n := range names {
		if len(n) != 20 {
			continue
		}
		g, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			continue
		}
		gens = append(gens, n)
		head = max(head, g)
	}
	return head, gens, nil
}

func (f *fileKV) claim(ctx context.Context, key string, val []byte, expiry time.Time) (bool, []byte, error) {
	dir := keyPath(key)
	for ctx.Err() == nil {
		head, gens, err := f.claimHead(dir)
		if err != nil {
			return false, nil, err
		}
		if head > 0 {
			cur, err := regfile.ReadFileIn(f.root, path.Join(dir, claimGen(head)))
			if err == nil && !claimExpired(cur, time.Now()) {
				return false, cur, nil
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return false, nil, err
			}
		}
		ok, err := f.create(ctx, key+"/"+claimGen(head+1), val)
		if err != nil {
			return false, nil, err
		}
		if ok {
			for _, g := range gens { // expired or released generations
				_ = f.root.Remove(path.Join(dir, g))
			}
			return true, nil, nil
		}
		// Another taker made that generation first: look again.
	}
	return false, nil, ctx.Err()
}

func (f *fileKV) claimed(ctx context.Context, key string) ([]byte, bool, error) {
	return f.liveClaim(keyPath(key))
}

// liveClaim returns the live claim of the claim directory dir (ok false when none).
func (f *fileKV) liveClaim(dir string) ([]byte, bool, error) {
	head, _, err := f.claimHead(dir)
	if err != nil || head == 0 {
		return nil, false, err
	}
	cur, err := regfile.ReadFileIn(f.root, path.Join(dir, claimGen(head)))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, false, nil
		}
		return nil, false, err
	}
	if claimExpired(cur, time.Now()) {
		return nil, false, nil
	}
	return cur, true, nil
}

func (f *fileKV) release(ctx context.Context, key string, val []byte) error {
	dir := keyPath(key)
	_, gens, err := f.claimHead(dir)
	if err != nil {
		return err
	}
	for _, g := range gens {
		p := path.Join(dir, g)
		if cur, err := regfile.ReadFileIn(f.root, p); err == nil && string(cur) == string(val) {
			if err := f.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	f.pruneDirs(dir)
	return nil
}

// reap removes, under prefix, every key file last written more than age ago and every
// temporary file older than tmpAge, then the directories left empty. It goes file by file,
// never a whole directory, so a key a live run writes meanwhile stays. A job space whose
// claim is live (its rank 0 is joining, until its own deadline) is left whole: its keys may
// be older than age (a job with a longer timeout than this one's) and are still read. own
// is the reaper's space, whose claim it holds itself.
func (f *fileKV) reap(ctx context.Context, prefix, own string, age time.Duration) error {
	now := time.Now()
	base, mine := keyPath(prefix), keyPath(own)
	var errs []error
	var walk func(dir string) bool // reports whether dir may now be empty
	walk = func(dir string) bool {
		if path.Dir(dir) == base && dir != mine {
			if _, live, err := f.liveClaim(path.Join(dir, "claim")); live || err != nil {
				return false // a joining job's space (or one whose claim cannot be read)
			}
		}
		d, err := f.root.Open(dir)
		if err != nil {
			return false
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return false
		}
		for _, n := range names {
			if ctx.Err() != nil {
				return false
			}
			p := path.Join(dir, n)
			st, err := f.root.Lstat(p)
			if err != nil {
				continue
			}
			if st.IsDir() {
				if walk(p) {
					_ = f.root.Remove(p) // fails, harmlessly, if not empty
				}
				continue
			}
			limit := age
			if strings.HasPrefix(n, tmpPrefix) {
				limit = tmpAge
			}
			if now.Sub(st.ModTime()) > limit {
				if err := f.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
		return true
	}
	if walk(base) {
		_ = f.root.Remove(base)
	}
	return errors.Join(errs...)
}

func (f *fileKV) close() error { return f.root.Close() }

// ---- redis:// ----

// redisKV keeps keys in a Redis server through go-redis: every command (and the connection,
// AUTH included) is bounded by its context's deadline. Keys expire ttl after they were
// written (0: never), so a run that died leaves nothing for long.
type redisKV struct {
	c   *redis.Client
	ttl time.Duration
}

func openRedisKV(spec storeSpec, ttl time.Duration) *redisKV {
	return &redisKV{ttl: ttl, c: redis.NewClient(&redis.Options{
		Addr:     spec.addr(),
		Username: spec.user,
		Password: spec.password,
		// RESP2, no CLIENT SETINFO: a plain GET/SET store needs nothing newer, and each
		// extra handshake command is one more round trip a slow server could stall.
		Protocol:              2,
		DisableIdentity:       true,
		ContextTimeoutEnabled: true, // the context's deadline bounds dial, AUTH and every command
		DialTimeout:           time.Minute,
		ReadTimeout:           time.Minute,
		WriteTimeout:          time.Minute,
		PoolSize:              2,
		MaxRetries:            1,
		DialerRetries:         1, // a refused connection fails the call at once, not after 5 dials
	})}
}

func (r *redisKV) put(ctx context.Context, key string, val []byte) error {
	return r.c.Set(ctx, key, val, r.ttl).Err()
}

func (r *redisKV) create(ctx context.Context, key string, val []byte) (bool, error) {
	return r.c.SetNX(ctx, key, val, r.ttl).Result()
}

func (r *redisKV) get(ctx context.Context, key string) ([]byte, bool, error) {
	v, err := r.c.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

func (r *redisKV) del(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	return r.c.Del(ctx, keys...).Err()
}

func (r *redisKV) claim(ctx context.Context, key string, val []byte, expiry time.Time) (bool, []byte, error) {
	for ctx.Err() == nil {
		ok, err := r.c.SetNX(ctx, key, val, max(time.Until(expiry), time.Millisecond)).Result()
		if err != nil || ok {
			return ok, nil, err
		}
		cur, found, err := r.get(ctx, key)
		if err != nil {
			return false, nil, err
		}
		if found {
			return false, cur, nil
		}
		// Expired or released between the two commands: try again.
	}
	return false, nil, ctx.Err()
}

func (r *redisKV) claimed(ctx context.Context, key string) ([]byte, bool, error) {
	return r.get(ctx, key)
}

// releaseScript deletes KEYS[1] only while it holds ARGV[1].
var releaseScript = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

func (r *redisKV) release(ctx context.Context, key string, val []byte) error {
	return releaseScript.Run(ctx, r.c, []string{key}, val).Err()
}

func (r *redisKV) reap(context.Context, string, string, time.Duration) error { return nil }

func (r *redisKV) close() error { return r.c.Close() }

// ---- helpers ----

// pollWait waits until key exists and returns its value, polling with a growing pause (a
// waiter waits itself); it fails when ctx ends.
func pollWait(ctx context.Context, s kv, key string) ([]byte, error) {
	if w, ok := s.(waiter); ok {
		return w.wait(ctx, key)
	}
	pause := time.Millisecond
	for {
		v, ok, err := s.get(ctx, key)
		if err != nil {
			return nil, err
		}
		if ok {
			return v, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 10*time.Millisecond)
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys(m map[string]struct{}) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
