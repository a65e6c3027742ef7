package job

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestStepWarnAfterFromEnvironment(t *testing.T) {
	env := func(v string, ok bool) func(string) (string, bool) {
		return func(name string) (string, bool) {
			if name != EnvStepWarnMs {
				return "", false
			}
			return v, ok
		}
	}
	for _, tc := range []struct {
		cfg  time.Duration
		v    string
		ok   bool
		want time.Duration
	}{
		{0, "", false, 0},
		{0, "250", true, 250 * time.Millisecond},
		{0, "0", true, -1},
		{time.Second, "250", true, time.Second}, // the config's own value wins
	} {
		got, err := stepWarnAfter(tc.cfg, env(tc.v, tc.ok))
		if err != nil || got != tc.want {
			t.Errorf("stepWarnAfter(%v, %s=%q): %v, %v; want %v", tc.cfg, EnvStepWarnMs, tc.v, got, err, tc.want)
		}
	}
	_, err := stepWarnAfter(0, env("5s", true))
	if !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), `CPCACHE_STEP_WARN_MS="5s"`) {
		t.Fatalf("a bad value: %v, want ErrBadValue naming it", err)
	}
}
