// Package netnstest gives a multi-process test two "machines" on one host: two network
// namespaces joined by a veth pair, each with its own address, so that ranks in different
// namespaces see different host identities and talk over a real (virtual) link.
//
// Contract: New creates the namespaces and the link, or skips the test with the reason
// (not root, no iproute2, network namespaces unusable here); everything it creates is removed
// by t.Cleanup. Names carry the test process's id, so concurrent test binaries do not clash
// as long as each package passes its own tag and subnet octet.
//
// Ownership: the Pair belongs to the test that created it; it is not safe to use after the
// test ends.
//
// Usage loop: p := netnstest.New(t, "cps", 214); then multiproc.Run with
// RankEnv: p.RankEnv(perHost) and Wrap: p.Wrap(perHost): ranks [0, perHost) run in the first
// namespace, the rest in the second.
package netnstest
