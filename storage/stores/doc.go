// Package stores holds cpcache's L3 backends, the implementations of storage.Storage, and
// opens them by URL (Open). Keys, the value format, the MAC, errors and Stats are package
// storage's; this package adds the clients (go-redis), the file system code, MAC key files
// (ReadKeyFile, LoadOrCreateKeyFile, $CPCACHE_STORAGE_KEY_FILE) and fault injection
// (WithFaults). Only what opens a store imports it: the cache itself (package hicache)
// takes an open storage.Storage.
//
// # Backends
//
//	file:///dir[?fsync=true&max_bytes=N&ttl=D]
//	                                  one file per page under dir/<ns>/<xx>/<hash>, written to
//	                                  a temporary file in the same directory and renamed (and
//	                                  fsynced, file and directory, with fsync=true); max_bytes
//	                                  bounds the directory, shared by every store that opens
//	                                  it, evicting least recently used pages, a chain's later
//	                                  ones first; ttl drops pages unused for longer (dircap.go)
//	redis://[[user]:pass@]host:port/prefix
//	rediss://...                      a Redis server through go-redis (rediss: TLS); keys
//	                                  "<prefix>:<ns>:<hash>", pipelined UNLINK / EXISTS /
//	                                  SET / GET; ?db=, ?ttl=, ?pool_size=,
//	                                  ?timeout=, ?dial_timeout=, ?read_timeout=,
//	                                  ?write_timeout=, ?tls_ca=, ?tls_cert=, ?tls_key=,
//	                                  ?skip_verify= and go-redis's other URL options
//	                                  (Sentinel is refused); needs a MAC key (see
//	                                  Authentication in package storage)
//	redis+cluster://[[user]:pass@]host:port,host:port.../prefix
//	rediss+cluster://...              a Redis Cluster through go-redis's cluster client,
//	                                  reached through the seed nodes named (any nodes of
//	                                  it); the same keys, spread over every master by
//	                                  their own slots (no hash tag), a batch pipelined
//	                                  per node, Clear scanning every master; the same
//	                                  options but db (redis_cluster.go)
//	mem://name                        process memory, for tests
//
// Every backend stores the value format of package storage (storage.MAC): a value that is
// torn, foreign, of another key or forged is a miss, counted, reported and deleted.
//
// # A directory others can write
//
// Whoever can write a file store's directory can delete its pages, and nothing more: they
// cannot forge a page (the MAC), and they cannot make the store act outside its directory.
// Every path under it is opened relative to the directory's handle without following
// symbolic links (openat2 with RESOLVE_NO_SYMLINKS, or O_NOFOLLOW component by component
// where the kernel lacks it). A link where the store keeps a namespace, fan-out, trash or
// page entry is never followed and never deleted through: it is counted (Stats.Links, each
// time one is met), reported to Options.OnWarning (ErrLink with its path, the first few)
// and skipped: reads miss (a page that is a link is also corrupt, and purged: the link is
// removed, not its target), puts through it are not made, deletes and purges remove
// nothing through it, and Clear removes the link itself with the namespace. The store's own
// key file must not be a link. A directory that group or others can write is reported at
// open (ErrWritableStore), sticky or not (sticky stops others removing the store's entries,
// not planting names it has yet to make). The directory itself, as named in the URL, may be
// a link: that is the operator's choice. Temporary files of a writer that died (older than
// TempMaxAge) are removed by the first Put of each Open into their directory.
//
// storagetest.Conformance is the contract every backend's tests run.
package stores
