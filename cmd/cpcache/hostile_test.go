package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeTrace writes a trace of a good line, then line, then a good line.
func writeTrace(t *testing.T, dir, name, line string) string {
	t.Helper()
	good := `{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}` + "\n"
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(good+line+"\n"+good), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHostileInputsExitTwoAtOnce: every input of issue 15's table is refused with exit 2
// before any rank starts, in one line of stderr that names the bad value, in under a
// second, leaving nothing in /dev/shm, the temporary directory or the process table; no
// password of a URL is ever printed.
func TestHostileInputsExitTwoAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	dir := t.TempDir()
	ids := strings.TrimSuffix(strings.Repeat("7,", 1_000_000), ",")
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"run world 100000", []string{"run", "--world", "100000"}, "over the limit of 256 local ranks"},
		{"launch -n 100000", []string{"launch", "-n", "100000", "--", "true"}, "over the limit of 256 local ranks"},
		{"page size overflow", []string{"run", "--page-size", "9223372036854775807"}, "page size 9223372036854775807 is over the limit"},
		{"kv bytes overflow", []string{"run", "--kv-bytes-per-token", "9223372036854775807"}, "KV bytes per token 9223372036854775807 is over the limit"},
		{"l1 pages 10M", []string{"run", "--l1-pages", "10000000"}, "more than the"},
		{"output_length max", []string{"run", "--workload", "trace", "--trace",
			writeTrace(t, dir, "out.jsonl", `{"timestamp": 0, "input_length": 600, "output_length": 9223372036854775807, "hash_ids": [1, 2]}`)},
			"line 2: output_length 9223372036854775807 is over the limit"},
		{"input_length 512e6", []string{"run", "--workload", "trace", "--trace",
			writeTrace(t, dir, "in.jsonl", `{"timestamp": 0, "input_length": 512000000, "output_length": 1, "hash_ids": [1]}`)},
			"line 2: input_length 512000000 is over the limit"},
		{"1e6 hash_ids", []string{"run", "--workload", "trace", "--trace",
			writeTrace(t, dir, "ids.jsonl", `{"timestamp": 0, "input_length": 512000000, "output_length": 1, "hash_ids": [`+ids+`]}`)},
			"line 2 is longer than 1048576 bytes"},
		{"json in a missing directory", []string{"run", "--json", filepath.Join(dir, "missing", "r.json")}, "--json " + filepath.Join(dir, "missing", "r.json")},
		{"json to /dev/full", []string{"run", "--json", "/dev/full"}, "--json /dev/full: not a regular file (a character device)"},
		{"flag error", []string{"run", "--bogus"}, "see cpcache run --help"},
		{"flag value error", []string{"launch", "-n", "many"}, "see cpcache launch --help"},
		{"store with a password", []string{"run", "--store", "redis://:s3cretPW@127.0.0.1:99999/p"}, "--store redis://:xxxxx@127.0.0.1:99999/p"},
		{"unreachable store", []string{"run", "--store", "redis://127.0.0.1:" + closedPort(t) + "/p"}, "unreachable"},
		{"launch store with a password", []string{"launch", "-n", "2", "--store", "redis://:s3cretPW@127.0.0.1:99999/p", "--", "true"}, "xxxxx"},
		{"storage with a password", []string{"run", "--storage", "redis://:s3cretPW@127.0.0.1:99999/p"}, "--storage redis://:xxxxx@127.0.0.1:99999/p"},
		{"storage with a password, unknown parameter", []string{"run", "--storage", "redis://:s3cretPW@127.0.0.1:6379/p?bogus=1"}, "xxxxx"},
		{"mem storage with a password", []string{"run", "--storage", "mem://:s3cretPW@x/p"}, "mem:// storage lives in one process"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			j := newJobEnv(t)
			cmd := j.command(c.args...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			err := cmd.Run()
			took := time.Since(start)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("%v: %v, want exit status 2; stderr:\n%s", c.args, err, stderr.String())
			}
			errOut := stderr.String()
			if lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n"); len(lines) != 1 || !strings.HasPrefix(errOut, "cpcache: ") {
				t.Errorf("stderr is %d lines, want one line starting cpcache: :\n%s", len(lines), errOut)
			}
			if !strings.Contains(errOut, c.want) {
				t.Errorf("stderr %q does not contain %q", errOut, c.want)
			}
			if strings.Contains(errOut+stdout.String(), "s3cret") {
				t.Errorf("the output shows the password: %s", errOut)
			}
			if strings.Contains(errOut, "starting") || stdout.Len() > 0 {
				t.Errorf("a rank started, or something was printed on stdout: %q %q", stdout.String(), errOut)
			}
			// At once: a refusal that waited on the network or on a rank would take the
			// --timeout (5 min by default) or a dial timeout; a loaded 2-core machine can take
			// more than a second just to start the binary under the race detector.
			if took > 10*time.Second {
				t.Errorf("refused after %v, want at once (well under --timeout)", took)
			}
			j.requireNothingLeft(t, 0, strings.Join(c.args, " "))
		})
	}
}

// TestInterruptExits130 sends SIGINT to `cpcache run` and to `cpcache launch` while their
// ranks serve: both exit with 130 and leave nothing behind.
func TestInterruptExits130(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the cpcache binary")
	}
	work := []string{"run", "--world", "2", "--dp", "1", "--attn-cp", "2", "--clients", "64", "--rounds", "12"}
	for _, args := range [][]string{work, append([]string{"launch", "-n", "2", "--"}, append([]string{cpcacheBinary(t)}, work...)...)} {
		t.Run(args[0], func(t *testing.T) {
			j := newJobEnv(t)
			cmd := j.command(args...)
			var stderr syncBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Interrupt once the launcher and both ranks run, and a little later.
			deadline := time.Now().Add(30 * time.Second)
			for j.processes() < 3 {
				if time.Now().After(deadline) {
					cmd.Process.Kill()
					t.Fatalf("never started:\n%s", stderr.String())
				}
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(300 * time.Millisecond)
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 130 {
				t.Fatalf("%s after SIGINT: %v, want exit status 130; stderr:\n%s", args[0], err, stderr.String())
			}
			j.requireNothingLeft(t, 2*time.Second, fmt.Sprint(args[0], " after SIGINT"))
		})
	}
}
