package runner

import (
	"encoding/json"
	"fmt"
	"os"
)

// writeFileAtomic writes v as JSON to dir/name through a rename, so readers never see a
// partial file.
func writeFileAtomic(dir, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeBytesAtomic(dir, name, b)
}

// writeBytesAtomic writes b to dir/name through a rename.
func writeBytesAtomic(dir, name string, b []byte) error {
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return fmt.Errorf("runner: status: %w", err)
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), statusPath(dir, name))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("runner: status: %w", err)
	}
	return nil
}
