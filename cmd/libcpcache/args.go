package main

import (
	"fmt"
	"slices"
	"time"
	"unsafe"
)

// Argument checks and conversions of the exported functions.

// maxTokens bounds a call's token count (cpcache.h: 2^40), far below where an int32 slice
// of that length or a byte count of it overflows.
const maxTokens = 1 << 40

// tokenSlice views n C tokens; NULL is accepted only with n == 0.
func tokenSlice(p unsafe.Pointer, n uint64, what string) ([]int32, error) {
	switch {
	case n == 0:
		return nil, nil
	case p == nil:
		return nil, fmt.Errorf("%w: %s is NULL with n = %d", errInvalid, what, n)
	case n > maxTokens:
		return nil, fmt.Errorf("%w: %s length %d is more than %d", errInvalid, what, n, uint64(maxTokens))
	}
	return unsafe.Slice((*int32)(p), n), nil
}

// needCap checks a caller's buffer for up to pages entries: NULL with capacity 0 means "not
// wanted" when allowNull; otherwise it must hold them all, so that a replicated call never
// stops half-way on one rank.
func needCap(p unsafe.Pointer, capacity uint64, pages int, what string, allowNull bool) error {
	if p == nil {
		if allowNull && capacity == 0 {
			return nil
		}
		return fmt.Errorf("%w: %s is NULL (capacity %d)", errInvalid, what, capacity)
	}
	if capacity < uint64(pages) {
		return fmt.Errorf("%w: %s holds %d entries, the call may return %d (n / page_tokens)", errSize, what, capacity, pages)
	}
	return nil
}

// waitLimit is cpcache_wait_l1's timeout_ms as a duration, and whether there is a limit:
// a negative value, or one past the longest time.Duration (INT64_MAX, about 292 years: what
// C callers pass for "forever"), has none. Multiplied out, such a value would wrap around to
// a deadline already passed.
func waitLimit(ms int64) (time.Duration, bool) {
	if ms < 0 || ms > maxTimeoutMs {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// latencyQuantiles returns the median and p99 of the consensus latencies.
func latencyQuantiles(lat []time.Duration) (median, p99 time.Duration) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
}

// maxKeyBytes bounds an isolation key: it is hashed on every keyed call (a longer key is a
// caller's bug, not a tenant name).
const maxKeyBytes = 4096

// keyString copies the isolation key key[0..n) into Go memory (a node keeps it); NULL with
// n = 0 is the empty key.
func keyString(p unsafe.Pointer, n uint64) (string, error) {
	switch {
	case n == 0:
		return "", nil
	case p == nil:
		return "", fmt.Errorf("%w: key is NULL with key_len = %d", errInvalid, n)
	case n > maxKeyBytes:
		return "", fmt.Errorf("%w: key_len %d is more than %d bytes", errInvalid, n, maxKeyBytes)
	}
	return string(unsafe.Slice((*byte)(p), n)), nil
}
