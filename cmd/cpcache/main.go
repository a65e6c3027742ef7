package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9/logging"
)

// command is one subcommand. run gets the arguments after the subcommand's name and returns
// the process exit status: 0 success, 1 failure, 2 bad usage or input.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

// register adds a subcommand; each lives in its own file and registers itself from init.
func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("cpcache: duplicate command " + c.name)
	}
	commands[c.name] = c
}

func main() {
	// go-redis logs every failed dial to stderr; the storage errors it causes are already
	// counted and reported (rate-limited) by the cache.
	logging.Disable()
	status := run(os.Args[1:], os.Stdout, os.Stderr)
	noteExit(status) // its launcher learns the status even if the kernel holds this process
	os.Exit(status)
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" {
			if c, ok := commands[args[1]]; ok {
				return c.run([]string{"--help"}, stdout, stderr)
			}
		}
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		return runVersion(args[1:], stdout, stderr)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "cpcache: unknown command %q (see cpcache --help)\n", args[0])
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "cpcache — a hierarchical KV cache for context-parallel groups.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: cpcache <command> [flags]   (cpcache <command> --help for its flags)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(w, "  %s%s  %s\n", n, strings.Repeat(" ", width-len(n)), commands[n].summary)
	}
}
