// Package redistest runs a real redis-server for tests: on a free loopback port, without
// persistence, owned by one test.
//
// Contract: Start returns once the server answers a PING (any reply counts, so a server
// started with --requirepass is ready too), or skips the test, saying why, when
// redis-server is not installed (Debian package redis-server; `make deps`). A server killed
// and started again listens on the same port and is empty.
//
// A Cluster's nodes are Servers started with --cluster-enabled (their bus ports free too,
// cluster-node-timeout 1s) and joined by redis-cli --cluster create; StartCluster returns
// once every node says cluster_state:ok and every replica is in sync.
//
// Ownership: the Server belongs to the test that started it; the test's cleanup kills it.
// Close (nil-safe, idempotent) kills it earlier.
//
// Usage:
//
//	srv := redistest.Start(t)              // extra redis-server flags may follow t
//	url := srv.URL("prefix")               // redis://127.0.0.1:port/prefix
//	tlsSrv := redistest.StartTLS(t, redistest.NewTLSFiles(t)) // a throwaway CA, TLS only
//	url = tlsSrv.URL("prefix")             // rediss://...?tls_ca=...&tls_cert=...&tls_key=...
//	srv.Client().Get(ctx, key)             // a go-redis client with the server's password and TLS
//	srv.Kill(); srv.Start()                // lose the server, bring back an empty one
//	srv.Signal(syscall.SIGSTOP)            // stall it (SIGCONT resumes)
//	c := redistest.StartCluster(t)         // 3 masters + 3 replicas (skips without redis-cli)
//	url = c.URL("prefix")                  // redis+cluster://node,node,.../prefix
//	c.WaitReplicated(d); c.MasterOf(key).Kill(); c.WaitOK(d) // a failover
package redistest
