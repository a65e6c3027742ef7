package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// referenceDoc is the reference guide whose generated sections these tests own.
const referenceDoc = "../../docs/reference.md"

// TestReferenceRunFlags: docs/reference.md's table of `cpcache run` flags is generated from
// run's flag set (runFlags: name, default, usage) and perRankFlags (which flags the ranks do
// not compare). A flag added, removed or reworded without the table fails here;
// CPCACHE_UPDATE_DOCS=1 rewrites the table.
func TestReferenceRunFlags(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runFlags(fs)
	var b strings.Builder
	b.WriteString("| flag | default | compared across ranks | meaning |\n| --- | --- | --- | --- |\n")
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if arg != "" {
			name += " " + arg
		}
		def := "—"
		if f.DefValue != "" {
			def = "`" + f.DefValue + "`"
		}
		compared := "yes"
		if why, own := perRankFlags[f.Name]; own {
			compared = "no: " + why
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, def, cell(compared), cell(usage))
	})
	checkGenerated(t, referenceDoc, "run-flags", b.String())
}

// cell makes text one Markdown table cell.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// checkGenerated compares the text between the markers
//
//	<!-- generated: NAME ... -->
//	<!-- end generated: NAME -->
//
// of the Markdown file path with want; with CPCACHE_UPDATE_DOCS=1 it writes want there.
func checkGenerated(t *testing.T, path, name, want string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	begin, end := "<!-- generated: "+name+" ", "<!-- end generated: "+name+" -->"
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q markers around the generated %s", path, begin, end, name)
	}
	i += strings.Index(doc[i:], "-->\n") + len("-->\n")
	if doc[i:j] == want {
		return
	}
	if os.Getenv("CPCACHE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(doc[:i]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the generated %s of %s", name, path)
		return
	}
	t.Errorf("the generated %s of %s is not the code's: rerun with CPCACHE_UPDATE_DOCS=1 to rewrite it (the code is the source)", name, path)
}
