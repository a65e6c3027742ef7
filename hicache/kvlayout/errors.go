package kvlayout

import (
	"errors"
	"fmt"
)

// ErrBadLayout is wrapped by every error of this package: a layout that does not validate, an
// attention-TP degree it cannot be split over, an encoding or text that does not decode to a
// valid layout, an unknown preset name.
var ErrBadLayout = errors.New("kvlayout: bad layout")

// Error is a layout's error: which part (Index and Part; Index is -1 for the layout as a
// whole) and why. It wraps ErrBadLayout.
type Error struct {
	Index  int    // the part's position in Layout.Parts; -1 when the error is the layout's own
	Part   string // the part's name ("" when Index is -1 or the name itself is missing)
	Reason string // what is wrong, in words
}

func (e *Error) Error() string {
	if e.Index < 0 {
		return "kvlayout: " + e.Reason
	}
	return fmt.Sprintf("kvlayout: part %d (%q): %s", e.Index, e.Part, e.Reason)
}

func (e *Error) Unwrap() error { return ErrBadLayout }

// ParseError is Parse's error for a token of the textual form that does not parse: the token
// as written (Token; its position among the ';'-separated tokens, from 0, in Position) and
// why. It wraps ErrBadLayout. A text whose tokens parse but whose layout does not validate
// gets Validate's *Error instead.
type ParseError struct {
	Position int    // the token's position, from 0
	Token    string // the token, as written
	Reason   string // what is wrong, in words
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("kvlayout: token %d %q: %s", e.Position, e.Token, e.Reason)
}

func (e *ParseError) Unwrap() error { return ErrBadLayout }

func layoutErr(format string, args ...any) *Error {
	return &Error{Index: -1, Reason: fmt.Sprintf(format, args...)}
}

func partErr(i int, p Part, format string, args ...any) *Error {
	return &Error{Index: i, Part: p.Name, Reason: fmt.Sprintf(format, args...)}
}
