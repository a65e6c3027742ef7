package main

import (
	"fmt"

	"github.com/cpcache/cpcache/internal/hostmem"
)

// The host-memory check of cpcache_open (as `cpcache run` makes its own before any rank
// starts): the pools this rank allocates must fit the memory available, or a typo in
// l1_pages or l2_pages gets the process killed by the kernel instead of an error.

// hostBytes is the host memory this rank's pools take: the L1 pool it allocates
// (CPCACHE_L1_ALLOC) and its host L2 slab. checkConfig bounded each product by MaxInt64.
func hostBytes(c *openConfig) (l1, l2 int64) {
	if c.l1Kind == l1Alloc {
		l1 = int64(c.l1Pages) * int64(c.pageBytes)
	}
	if c.slabKind == slabHost {
		l2 = int64(c.l2Pages) * int64(c.pageBytes)
	}
	return l1, l2
}

// checkHostMemory refuses pools larger than avail bytes (from source, for the message).
func checkHostMemory(c *openConfig, avail int64, source string) error {
	l1, l2 := hostBytes(c)
	if l1 > avail || l2 > avail-l1 {
		return fmt.Errorf("%w: l1_pages %d and l2_pages %d of page_bytes %d need %s of host memory (L1 pool %s, L2 slab %s), more than the %s available (%s)",
			errInvalid, c.l1Pages, c.l2Pages, c.pageBytes, hostmem.GiB(float64(l1)+float64(l2)), hostmem.GiB(float64(l1)), hostmem.GiB(float64(l2)), hostmem.GiB(float64(avail)), source)
	}
	return nil
}
