package kvevents

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// maxIPCPath is the longest ipc:// path a Unix socket address holds (sun_path, less its NUL).
const maxIPCPath = 107

// Bindable says whether the PUB socket binds ep (else it connects to a subscriber that
// binds), by vLLM's rule: a wildcard ("*", "::"), ipc:// or inproc://.
func Bindable(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// CheckEndpoint says whether ep is an endpoint this package can bind (bind) or connect
// to: tcp://HOST:PORT (to bind, HOST is *, an IP address in brackets for IPv6, or
// localhost; to connect, also a host name; PORT 0-65535, 0 only to bind), ipc://PATH (at
// most 107 bytes) or inproc://NAME. The error names ep and what is wrong with it.
func CheckEndpoint(ep string, bind bool) error {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return fmt.Errorf("kvevents: endpoint %q: want tcp://HOST:PORT, ipc://PATH or inproc://NAME", ep)
	}
	switch scheme {
	case "ipc":
		if rest == "" {
			return fmt.Errorf("kvevents: endpoint %q has no path", ep)
		}
		if len(rest) > maxIPCPath {
			return fmt.Errorf("kvevents: endpoint %q: path of %d bytes, a Unix socket holds at most %d", ep, len(rest), maxIPCPath)
		}
		return nil
	case "inproc":
		if rest == "" {
			return fmt.Errorf("kvevents: endpoint %q has no name", ep)
		}
		return nil
	case "tcp":
	default:
		return fmt.Errorf("kvevents: endpoint %q: unknown scheme %q (want tcp, ipc or inproc)", ep, scheme)
	}
	i := strings.LastIndex(rest, ":")
	if i < 0 || strings.HasSuffix(rest, "]") {
		return fmt.Errorf("kvevents: endpoint %q has no port", ep)
	}
	host, portStr := rest[:i], rest[i+1:]
	port, err := strconv.Atoi(portStr)
	if err != nil || portStr == "" || portStr[0] == '+' || portStr[0] == '-' {
		return fmt.Errorf("kvevents: endpoint %q: port %q is not a number", ep, portStr)
	}
	if port < 0 || port > 65535 {
		return fmt.Errorf("kvevents: endpoint %q: port %d is out of range (0-65535)", ep, port)
	}
	if port == 0 && !bind {
		return fmt.Errorf("kvevents: endpoint %q: port 0 can only be bound", ep)
	}
	switch {
	case host == "":
		return fmt.Errorf("kvevents: endpoint %q has no host", ep)
	case host == "*" || host == "localhost":
		return nil
	case strings.HasPrefix(host, "["):
		if a, err := netip.ParseAddr(strings.TrimSuffix(host[1:], "]")); err != nil || !strings.HasSuffix(host, "]") || !a.Is6() {
			return fmt.Errorf("kvevents: endpoint %q: host %s is not an IPv6 address", ep, host)
		}
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Is6() {
			return fmt.Errorf("kvevents: endpoint %q: write the IPv6 address in brackets, tcp://[%s]:%d", ep, host, port)
		}
		return nil
	}
	if bind {
		return fmt.Errorf("kvevents: endpoint %q is bound: host %q is not *, an IP address or localhost", ep, host)
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || strings.Trim(label, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
			return fmt.Errorf("kvevents: endpoint %q: host %q is not a host name or an IP address", ep, host)
		}
	}
	return nil
}

// OffsetEndpoint is the endpoint of DP replica dp, as vLLM numbers them: a tcp:// port plus
// dp, an inproc:// name with "_dp<dp>" appended; replica 0 keeps ep. It checks the result
// (CheckEndpoint, bound when bind): a port pushed past 65535 is an error naming ep and dp.
func OffsetEndpoint(ep string, dp int, bind bool) (string, error) {
	if ep == "" {
		return "", nil
	}
	if err := CheckEndpoint(ep, bind); err != nil {
		return "", err
	}
	if dp == 0 {
		return ep, nil
	}
	switch {
	case strings.HasPrefix(ep, "inproc://"):
		return fmt.Sprintf("%s_dp%d", ep, dp), nil
	case strings.HasPrefix(ep, "tcp://"):
		i := strings.LastIndex(ep, ":")
		port, _ := strconv.Atoi(ep[i+1:]) // checked above
		if port == 0 {
			return "", fmt.Errorf("kvevents: endpoint %q: port 0 (any) cannot be numbered for replica %d", ep, dp)
		}
		if port+dp > 65535 {
			return "", fmt.Errorf("kvevents: endpoint %q: replica %d would use port %d, above 65535", ep, dp, port+dp)
		}
		return fmt.Sprintf("%s:%d", ep[:i], port+dp), nil
	}
	return "", fmt.Errorf("kvevents: endpoint %q: want tcp:// or inproc:// to offset for replica %d", ep, dp)
}
