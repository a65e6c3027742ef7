package report

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestReferenceListsReportFields: docs/reference.md's table of report fields lists every key
// of the JSON report (Report's top-level fields) and no key the report does not have, each
// named in a row's first cell.
func TestReferenceListsReportFields(t *testing.T) {
	doc, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	i := strings.Index(text, "\n## Report fields\n")
	if i < 0 {
		t.Fatal("docs/reference.md has no \"## Report fields\" section")
	}
	section := text[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	listed := map[string]bool{}
	key := regexp.MustCompile("`([a-z0-9_]+)`")
	for _, line := range strings.Split(section, "\n") {
		if cells := strings.Split(line, "|"); len(cells) > 2 && strings.TrimSpace(cells[0]) == "" {
			for _, m := range key.FindAllStringSubmatch(cells[1], -1) {
				listed[m[1]] = true
			}
		}
	}
	keys := map[string]bool{}
	rt := reflect.TypeOf(Report{})
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys[name] = true
		}
	}
	for k := range keys {
		if !listed[k] {
			t.Errorf("docs/reference.md's report fields lack %s", k)
		}
	}
	for k := range listed {
		if !keys[k] {
			t.Errorf("docs/reference.md's report fields list %s, which the report does not have", k)
		}
	}
}
