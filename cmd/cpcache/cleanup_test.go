package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestCleanupReportsWhatItRemoved: `cpcache cleanup` names the directory of a finished job
// it removed, leaves a live job's alone, and says "nothing to remove" when there is none.
func TestCleanupReportsWhatItRemoved(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	var stdout, stderr bytes.Buffer
	if status := runCleanup(nil, &stdout, &stderr); status != 0 || stdout.String() != "nothing to remove: no directory of a finished cpcache job in "+tmp+"\n" {
		t.Fatalf("cleanup of an empty directory: status %d, stdout %q, stderr %q; want nothing to remove", status, stdout.String(), stderr.String())
	}

	// A job directory whose creator has exited, and one of this (live) process.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(tmp, "cpcache-run-"+strconv.Itoa(gone.Process.Pid)+"-1")
	live := filepath.Join(tmp, "cpcache-launch-"+strconv.Itoa(os.Getpid())+"-2")
	for _, d := range []string{dead, live} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, ownerFile), []byte(pidNamespace()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stdout.Reset()
	if status := runCleanup(nil, &stdout, &stderr); status != 0 || stdout.String() != "removed "+dead+"\n" {
		t.Fatalf("cleanup: status %d, stdout %q; want it to name %s alone", status, stdout.String(), dead)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("the live job's directory went: %v", err)
	}
}
