package storage

import (
	"errors"
	"testing"
)

func TestParseInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "42": 42, "-1": -1, "123456789012345678": 123456789012345678} {
		if got, err := parseInt([]byte(in)); err != nil || got != want {
			t.Errorf("parseInt(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-", "1a", "+1", " 1", "1234567890123456789"} {
		if _, err := parseInt([]byte(in)); !errors.Is(err, errProtocol) {
			t.Errorf("parseInt(%q): err=%v; want a protocol error", in, err)
		}
	}
}

func TestTransientReply(t *testing.T) {
	for msg, want := range map[string]bool{
		"LOADING Redis is loading the dataset in memory":          true,
		"BUSY Redis is busy running a script":                     true,
		"OOM command not allowed when used memory > 'maxmemory'.": false,
		"ERR unknown command":                                     false,
	} {
		if got := transientReply(msg); got != want {
			t.Errorf("transientReply(%q) = %v, want %v", msg, got, want)
		}
	}
}
