package redact

import (
	"net/url"
	"slices"
	"strings"
)

// Mask replaces every secret.
const Mask = "xxxxx"

// secretParams are query parameters whose values are secrets (compared case-insensitively).
var secretParams = []string{"password", "passwd", "pass", "pwd", "secret", "token", "key", "auth", "apikey", "api_key"}

func isSecretParam(name string) bool {
	name = strings.ToLower(name)
	return slices.Contains(secretParams, name)
}

// URL returns raw with its secrets replaced by Mask.
func URL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return maskAuthority(raw)
	}
	if len(secrets(raw)) == 0 {
		return raw
	}
	if userinfo, ok := opaqueUserinfo(u); ok && userinfo != "" {
		u.Opaque = Mask + u.Opaque[len(userinfo):] // redis:SECRET@host: no "//", so no u.User
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		} else if u.User.Username() != "" {
			u.User = url.User(Mask) // redis://SECRET@host: a bare user is the password
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		for name := range q {
			if isSecretParam(name) {
				q[name] = []string{Mask}
			}
		}
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// splitUserinfo splits a URL that does not parse at the userinfo of its authority:
// scheme://USERINFO@rest. ok is false when it has none.
func splitUserinfo(raw string) (scheme, userinfo, rest string, ok bool) {
	scheme, after, found := strings.Cut(raw, "://")
	if !found {
		return "", "", "", false
	}
	authority := after
	if i := strings.IndexAny(after, "/?#"); i >= 0 {
		authority = after[:i]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return "", "", "", false
	}
	return scheme, after[:at], after[at:], true
}

// opaqueUserinfo returns what precedes the last '@' of an opaque URL (scheme:USERINFO@host,
// without "//").
func opaqueUserinfo(u *url.URL) (string, bool) {
	at := strings.LastIndex(u.Opaque, "@")
	if at < 0 {
		return "", false
	}
	return u.Opaque[:at], true
}

// maskAuthority masks the userinfo of a URL that does not parse.
func maskAuthority(raw string) string {
	scheme, _, rest, ok := splitUserinfo(raw)
	if !ok {
		return raw
	}
	return scheme + "://" + Mask + rest
}

// secrets are the substrings of raw that must never be shown: its password (or bare user)
// and the values of its secret query parameters, raw and escaped.
func secrets(raw string) []string {
	var out []string
	add := func(s string) {
		if s != "" && s != Mask {
			out = append(out, s)
			if e := url.QueryEscape(s); e != s {
				out = append(out, e)
			}
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		if _, userinfo, _, ok := splitUserinfo(raw); ok {
			add(userinfo)
			if _, pw, ok := strings.Cut(userinfo, ":"); ok {
				add(pw)
			}
		}
		return out
	}
	if u.User != nil {
		if pw, has := u.User.Password(); has {
			add(pw)
		} else {
			add(u.User.Username())
		}
	}
	if userinfo, ok := opaqueUserinfo(u); ok {
		add(userinfo)
	}
	for name, vals := range u.Query() {
		if isSecretParam(name) {
			for _, v := range vals {
				add(v)
			}
		}
	}
	return out
}

// Error returns err with every secret of raw masked in its message; it wraps err. A nil err
// gives nil, and an error that quotes no secret is returned as is.
func Error(err error, raw string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	masked := msg
	for _, s := range secrets(raw) {
		masked = strings.ReplaceAll(masked, s, Mask)
	}
	if masked == msg {
		return err
	}
	return &maskedError{msg: masked, err: err}
}

type maskedError struct {
	msg string
	err error
}

func (e *maskedError) Error() string { return e.msg }
func (e *maskedError) Unwrap() error { return e.err }
