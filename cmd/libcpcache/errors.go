package main

import "errors"

// Sentinels of the C ABI's own checks; each maps to one status code.
var (
	errInvalid     = errors.New("cpcache: invalid argument")
	errSize        = errors.New("cpcache: wrong size")
	errRange       = errors.New("cpcache: out of range")
	errClosed      = errors.New("cpcache: closed")
	errAlreadyOpen = errors.New("cpcache: already open")
	errInternal    = errors.New("cpcache: internal error")
)
