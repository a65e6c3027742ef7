package main

import (
	"fmt"
	"io"
	"os"
)

func init() {
	register(command{name: "cleanup", summary: "remove what crashed jobs of this user left behind (temporary directories)", run: runCleanup})
}

func runCleanup(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("cleanup", "", "Removes the temporary directories (cpcache-run-PID-*, cpcache-launch-PID-*) of this\n"+
		"user whose creating process is gone. `cpcache run` and `cpcache launch` do this at every\n"+
		"start too. Shared-memory segments need no cleanup: they are anonymous (memfd) and the\n"+
		"kernel frees them with the last process that maps them. Prints each directory it\n"+
		"removed, or \"nothing to remove\".", stderr)
	if status, done := parseFlags(fs, args); done {
		return status
	}
	if fs.NArg() > 0 {
		return fail(stderr, 2, fmt.Errorf("cleanup: unexpected argument %q (see cpcache cleanup --help)", fs.Arg(0)))
	}
	removed := reclaimJobDirs()
	for _, d := range removed {
		fmt.Fprintf(stdout, "removed %s\n", d)
	}
	if len(removed) == 0 {
		fmt.Fprintf(stdout, "nothing to remove: no directory of a finished cpcache job in %s\n", os.TempDir())
	}
	return 0
}
