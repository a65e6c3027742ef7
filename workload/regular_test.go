package workload

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestReadTraceFileRefusesWhatIsNotAFile: a named pipe without a writer (whose open waited
// forever), a directory and a device are refused at once, naming the path and its kind.
func TestReadTraceFileRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "trace.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, kind := range map[string]string{fifo: "a named pipe", dir: "a directory", "/dev/null": "a character device"} {
		done := make(chan error, 1)
		go func() { _, err := ReadTraceFile(path, TraceOptions{}); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) || err.Error() != "workload: open trace: "+path+": not a regular file ("+kind+")" {
				t.Errorf("ReadTraceFile(%s) = %v, want ErrNotRegular naming %s", path, err, kind)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("ReadTraceFile(%s) still waiting after 10 s", path)
		}
	}
	good := filepath.Join(dir, "good.jsonl")
	if err := os.WriteFile(good, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if reqs, err := ReadTraceFile(good, TraceOptions{}); err != nil || len(reqs) != 1 {
		t.Errorf("ReadTraceFile(a regular file) = %d requests, %v", len(reqs), err)
	}
}
