// Package vtime is the virtual time of a simulated serving run: the cost profiles of a
// scheduler step (cost.go) and the virtual clock that charges them (Clock). Nothing sleeps:
// the clock is a number, advanced only by what the scheduler decided, so every rank of a
// replica keeps the same clock.
package vtime
