package relay

import (
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestOnePackageDoc: the package doc lives in doc.go alone; a second one in
// another file would be glued onto it by go doc in file order.
func TestOnePackageDoc(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if has := f.Doc != nil; has != (name == "doc.go") {
			t.Errorf("%s: package doc present = %v, want it in doc.go only", name, has)
		}
	}
}
