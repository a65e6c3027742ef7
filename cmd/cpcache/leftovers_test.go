package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// jobEnv runs the cpcache binary with a private TMPDIR (so that what a job leaves in the
// temporary directory, and which processes belong to it, can be told exactly) and without
// the launcher variables of the test's own environment.
type jobEnv struct {
	tmp  string   // the job's TMPDIR
	shm  []string // cpcache names in /dev/shm before the test
	env  []string
	path string // the binary
}

func newJobEnv(t *testing.T) *jobEnv {
	t.Helper()
	j := &jobEnv{tmp: t.TempDir(), shm: shmNames(), path: cpcacheBinary(t)}
	j.env = append(withoutLauncherEnv(func(name string) bool { return name == "TMPDIR" || strings.HasPrefix(name, "CPCACHE_") }), "TMPDIR="+j.tmp)
	return j
}

// command is the binary with args in the job's environment.
func (j *jobEnv) command(args ...string) *exec.Cmd {
	cmd := exec.Command(j.path, args...)
	cmd.Env = j.env
	return cmd
}

// shmNames lists the cpcache segment files in /dev/shm (directories are other tests'
// private segment directories, made while packages are tested in parallel).
func shmNames() []string {
	m, _ := filepath.Glob("/dev/shm/cpcache-*")
	return slices.DeleteFunc(m, func(name string) bool {
		fi, err := os.Lstat(name)
		return err != nil || fi.IsDir()
	})
}

// leftovers describes what the job left behind: entries in its TMPDIR, new cpcache names
// in /dev/shm, and live processes of the job (found by the TMPDIR in their environment or
// command line; a zombie waiting to be reaped is dead).
func (j *jobEnv) leftovers() []string {
	var out []string
	ents, _ := os.ReadDir(j.tmp)
	for _, e := range ents {
		out = append(out, "temporary "+filepath.Join(j.tmp, e.Name()))
	}
	before := map[string]bool{}
	for _, n := range j.shm {
		before[n] = true
	}
	for _, n := range shmNames() {
		if !before[n] {
			out = append(out, "segment "+n)
		}
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !bytes.Contains(env, []byte("TMPDIR="+j.tmp+"\x00")) && !bytes.Contains(cmdline, []byte(j.tmp)) {
			continue
		}
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' {
			continue
		}
		out = append(out, fmt.Sprintf("process %d %q", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return out
}

// requireNothingLeft waits up to within for the job's leftovers to go and fails naming them.
func (j *jobEnv) requireNothingLeft(t *testing.T, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := j.leftovers()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: left behind after %v:\n%s", what, within, strings.Join(left, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processes counts the live processes of the job.
func (j *jobEnv) processes() int {
	n := 0
	for _, l := range j.leftovers() {
		if strings.HasPrefix(l, "process ") {
			n++
		}
	}
	return n
}
