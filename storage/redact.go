package storage

import "strings"

// RedactURL returns rawURL with its password (redis://user:xxxxx@host; a lone
// redis://xxxxx@host, which Redis reads as a password) and the values of query parameters
// that look secret (names containing pass, secret, key, token or auth) replaced by "xxxxx",
// even if rawURL does not parse. Use it wherever a storage URL
// is shown.
func RedactURL(rawURL string) string {
	if i := strings.IndexByte(rawURL, '?'); i >= 0 {
		return redactUserinfo(rawURL[:i]) + "?" + redactQuery(rawURL[i+1:])
	}
	return redactUserinfo(rawURL)
}

func redactQuery(q string) string {
	params := strings.Split(q, "&")
	for i, p := range params {
		name, _, hasValue := strings.Cut(p, "=")
		lower := strings.ToLower(name)
		for _, w := range []string{"pass", "secret", "key", "token", "auth"} {
			if hasValue && strings.Contains(lower, w) {
				params[i] = name + "=xxxxx"
			}
		}
	}
	return strings.Join(params, "&")
}

func redactUserinfo(rawURL string) string {
	rest := rawURL
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	} else if i := strings.IndexByte(rest, ':'); i >= 0 {
		rest = rest[i+1:]
	}
	authority := rest
	if i := strings.IndexAny(authority, "/#"); i >= 0 {
		authority = authority[:i]
	}
	at := strings.LastIndexByte(authority, '@')
	if at < 0 {
		return rawURL
	}
	start := len(rawURL) - len(rest)
	userinfo := authority[:at]
	user, pass, hasPass := strings.Cut(userinfo, ":")
	switch {
	case hasPass && pass == "": // user:@host: no secret
		return rawURL
	case hasPass: // user:password@host
		return rawURL[:start] + user + ":xxxxx" + rawURL[start+at:]
	default: // secret@host: Redis reads a lone user name as the password
		return rawURL[:start] + "xxxxx" + rawURL[start+at:]
	}
}
