package runner

import (
	"slices"
	"strings"
)

// SweepParams are the parameters --sweep accepts (each also a `cpcache run` flag).
var SweepParams = []string{"l2-pages", "l1-pages", "policy", "prefetch-policy"}

// ParseSweep parses a --sweep value, "param=v1,v2,...", e.g. "l2-pages=1024,4096,16384".
// The values are checked when each run's flags are parsed. Errors wrap ErrBadInput.
func ParseSweep(s string) (param string, values []string, err error) {
	param, list, ok := strings.Cut(s, "=")
	if !ok || !slices.Contains(SweepParams, param) {
		return "", nil, bad("sweep %q: want PARAM=V1,V2,... with PARAM one of %s", s, strings.Join(SweepParams, ", "))
	}
	for _, v := range strings.Split(list, ",") {
		if v = strings.TrimSpace(v); v == "" {
			return "", nil, bad("sweep %q: an empty value", s)
		}
		values = append(values, v)
	}
	return param, values, nil
}
