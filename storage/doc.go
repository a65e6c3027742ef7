// Package storage is cpcache's L3 tier: a page store below the shared L2, reached by URL.
// Pages backed up to it survive L2 eviction and restarts and are shared by every serving
// instance that uses the same store and namespace.
//
// # Keys and namespaces
//
// A Namespace is derived (SHA-256, fixed tags, no per-process seed) from an identity string
// that must name everything that changes the bytes of a page: model, dtype, KV layout, page
// size, parallel shape. A Key is the namespace ID (8 bytes) followed by a 128-bit hash of the
// namespace and the page's chained prefix hash: PageKey(ns, id, shard) for the cache's
// 256-bit page ids (hicache/core.PageID, SHA-256 chained over the prefix and the isolation
// key), NewKeyBytes for other chained hashes, NewKey for a 64-bit one, ChainKeys to chain
// per-page hashes. PageKey's domain tag is its own, so its keys are none of those the others
// derive. Pages of different namespaces never collide, a storage
// refuses keys of a namespace other than its own (ErrBadArgument), and Clear removes exactly
// its own namespace. The key and value formats are fixed; the tests pin them with golden
// values.
//
// # Backends
//
// This package is the interface only: it depends on the standard library, the project and
// the MAC's hash, so that the cache (package hicache), which imports it, links no storage
// client. The backends — a directory (file://), Redis and Redis Cluster (redis://,
// rediss://, redis+cluster://), process memory (mem://) — are package storage/stores,
// which opens them by URL (stores.Open), resolves MAC key files and injects faults
// (stores.WithFaults). A backend encodes and verifies its values with a MAC (NewMAC) and
// reports its key's fingerprint by a KeyFingerprint method.
//
// Every value is stored as a 160-byte header (magic, version 5, key, length, CRC-32C of the
// payload, the binding — its page's token digest and its parent's id —, the payload MAC's
// algorithm and nonce, a MAC of the payload, a MAC of the header, CRC-32C of the header)
// followed by the payload (format.go). PutBound stores a binding and GetBound checks it: a
// genuine value bound to other tokens or another parent is a miss (ErrMismatch,
// Stats.Mismatched). Values of format version 4 (the previous release's: a 144-byte header,
// keyed BLAKE3) are read as they are; older ones are misses (ErrOldFormat,
// Stats.OldFormat).
//
// A value that is torn, foreign, stored under another key, of the wrong length, failing
// its checksum or its MAC is never loaded: Get treats it as a miss, counts it in
// Stats.Corrupt (and Stats.Forged when its checksums hold but its MAC or key does not),
// reports it to Options.OnCorrupt (an error wrapping ErrCorrupt, and ErrForged) and deletes
// it (Stats.Purged), so that the next backup of the page, which asks Exists first, writes a
// genuine copy. Exists on the directory backend authenticates each header too (never a
// payload: a payload damaged behind a genuine header is found by the Get that reads it). A
// miss is not an error.
//
// # Authentication
//
// Every value carries two MACs under keys derived from the storage's secret MAC key: a
// header MAC, keyed BLAKE3 (truncated to 128 bits) over the header — the value's key,
// length, binding, checksum and the payload MAC with its algorithm and nonce — and a
// payload MAC of one of two algorithms, named in the header (MACAlg): without the key
// nobody can write a value that loads, and a genuine value copied under another key does
// not load either. Values are not encrypted.
//
// The payload MAC is picked by the writer's CPU (PreferredMACAlg), because it is most of
// the CPU a Get or a Put costs: AES-256-GMAC where the CPU has AES and carry-less multiply
// instructions (x86 AES-NI and PCLMULQDQ, arm64 AES and PMULL; Go's AES-GCM then runs in
// assembly), else keyed BLAKE3 over the header's first 124 bytes and the payload. Measured
// on the 2-core Xeon (VAES, VPCLMULQDQ, AVX-512) this was built on, over 64 KiB: GMAC 7.8–8.0
// GB/s, keyed BLAKE3 2.2–3.1 GB/s (zeebo/blake3), CRC-32C 22 GB/s, memcpy 80 GB/s. Readers
// verify either algorithm whatever their CPU (Go's software AES is constant-time), so
// writers of both kinds share a store.
//
// Why the GMAC is sound. GMAC is GCM's authentication alone (an empty plaintext, the
// payload as additional data): a MAC whose security rests on never using one nonce twice
// under one key — two tags under one nonce reveal the hash key and let anyone forge. Each
// value written draws a fresh random 96-bit nonce (crypto/rand) into its header; the GMAC
// key is derived from the storage key for this purpose alone (BLAKE3 DeriveKey, its own
// context), never the BLAKE3 MAC key. Random 96-bit nonces collide with probability about
// q²/2⁹⁷ after q values: below 2⁻³² up to 2³² values written under one storage key (the
// bound NIST SP 800-38D sets for random IVs), that is 256 TiB of 64 KiB pages; rotate the
// key before that. The header MAC covers the nonce and the payload MAC, and the header's
// key, length and binding: the GMAC tag, computed over the payload alone, is bound to the
// rest of the value through it, so a genuine payload and tag moved under another header do
// not verify, and neither does a header relabelled with the other algorithm. The key is Options.MACKey, else the file Options.MACKeyFile, else the file
// named by $CPCACHE_STORAGE_KEY_FILE (stores.ReadKeyFile refuses files that group or others can
// read or write); without any, a file store creates and uses <dir>/.cpcache-storage-key
// (stores.LoadOrCreateKeyFile), a mem store a random key per table, and a Redis store refuses to
// open (ErrNoKey) unless Options.Insecure accepts unauthenticated values (an insecure store
// computes no MACs, writes values marked unauthenticated and reads only those; a keyed
// store rejects them as forged). Every user of a
// store must use the same key; KeyFingerprint lets them compare keys without showing them.
// No error shows a key or a URL's password.
//
// # Errors and deadlines
//
// Errors are *OpError values, "storage: <backend> <where> <op>: ...", wrapping a sentinel
// (ErrUnavailable, ErrBadArgument, ErrClosed, ErrNoKey with ErrBadArgument; ErrCorrupt and
// ErrForged only through OnCorrupt) and the cause. Every call is bounded by Options.Timeout,
// or by its context's deadline when that comes earlier. The Redis backend never panics or
// hangs on a dead or stopped server: the call fails with ErrUnavailable by the deadline (or
// at once when its context is cancelled), and later calls reconnect by themselves once the
// server is back (go-redis retries a failed command once on a fresh connection). A
// server's refusal (NOAUTH, WRONGPASS, OOM) is an error naming it, without a sentinel. A
// call that failed may still have taken effect, wholly or in part (a Put or Delete the
// server received before the deadline runs when it resumes): every operation is
// idempotent, so the remedy is to repeat it or ignore it.
//
// The directory backend bounds its calls even when the file system stops answering inside
// the kernel (a frozen ext4, a hung NFS or FUSE mount), where no context reaches: each file
// operation runs on a goroutine of its own, abandoned at the call's deadline (the call fails
// with ErrUnavailable; Stats.Abandoned, and Stats.Stuck while the kernel holds it). An
// abandoned operation reads and writes only private copies of the pages, so the caller's
// buffers are never touched after its call returned: a Put encodes each page into a
// private buffer (the copy fused with its checksum) and writes that; a Get reads a page
// that the page cache holds straight into the caller's buffer with a read that cannot
// wait (RWF_NOWAIT, made by the call itself, never detached) and verifies it there, and
// reads any other page into a private buffer that it verifies and copies from.
//
// # The page cache, not O_DIRECT
//
// A file store reads and writes through the page cache. Measured (BenchmarkDataPath, make
// bench-storage: the ratios are in README.md), a Get of cached pages is 1.2–2.3× the speed
// of reading the same files with O_DIRECT, and a Get of pages evicted from the cache
// 0.64–0.83× of it (a disk read, then the kernel's copy and the MAC): the kernel's copy that
// O_DIRECT saves costs less than the MAC, and an O_DIRECT read could not go straight into the caller's buffer anyway (the
// header before the payload leaves it unaligned in the file) nor serve the next read of a
// hot page from memory. Pages a job reads back are mostly the ones it, or the job before
// it, just wrote, still in the cache. With
// Options.MaxStuck operations stuck, calls fail at once (ErrStuck) until the kernel lets
// them go. stores.Faults.Freeze simulates such a file system.
//
// # Ownership and usage
//
// A Storage is safe for concurrent use; the caller owns it and closes it (Close is nil-safe
// and idempotent). Get reads into caller-provided buffers (L2 slab pages; the Redis backend
// copies there the value go-redis read); a buffer's contents are unspecified after a miss,
// so only pages reported found may be published. Put does not retain its buffers. In cpcache
// every rank owns a Storage on the same store and drives it, for the pages it owns, from the
// cache's backup and prefetch queues; results take effect only through the consensus step. A
// typical loop:
//
//	ns, _ := storage.NewNamespace("model=llama3-8b;dtype=bf16;page_tokens=64;page_bytes=65536")
//	st, err := stores.Open(ctx, "file:///var/cache/cpcache", storage.Options{Namespace: ns})
//	if err != nil { ... }
//	defer st.Close()
//	keys := make([]storage.Key, len(chainedHashes))
//	for i, h := range chainedHashes { keys[i] = storage.NewKey(ns, h) }
//	n, err := st.Exists(ctx, keys, nil)         // how much of the prefix is stored
//	n, err = st.Get(ctx, keys[:n], pages, nil)  // read into reserved slab pages
//	err = st.Put(ctx, keys, pages)              // back up committed pages
//
// storagetest.Conformance is the contract every backend's tests run.
package storage
