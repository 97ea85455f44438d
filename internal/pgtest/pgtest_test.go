package pgtest

import (
	"database/sql"
	"testing"
)

// TestStartQueryRestart: a server answers on its port, keeps its data
// across a restart, and a database of a test's own is made.
func TestStartQueryRestart(t *testing.T) {
	s := Start(t)
	url := s.NewDatabase("t1")
	db, err := sql.Open("postgres", url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE x (v int); INSERT INTO x VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	var v int
	if err := db.QueryRow("SELECT v FROM x").Scan(&v); err != nil || v != 7 {
		t.Fatalf("after restart: %v, %d", err, v)
	}
}
