// Package redact hides the secrets of a URL (a password in its userinfo, the values of
// query parameters that name a secret) before the URL, or an error that may quote it, is
// printed, logged or reported.
//
// Contract: URL returns the URL with every secret replaced by Mask, also when it does not
// parse (everything between "://" and the last "@" of the authority is then masked). Error
// returns an error whose message has every secret of the URL replaced by Mask and that
// still wraps the original (errors.Is and errors.As see through it). Pure functions, no
// state.
//
// Usage: wherever a command formats a user-given URL or an error about one,
//
//	fmt.Errorf("--storage %s: %w", redact.URL(raw), redact.Error(err, raw))
package redact
