//go:build unix

package redistest

import "syscall"

// Pause stops the server with SIGSTOP: it keeps its port and connections
// and answers nothing until Resume. The test's end resumes it.
func (s *Server) Pause() {
	s.tb.Helper()
	s.signal(syscall.SIGSTOP)
	s.tb.Cleanup(s.Resume)
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }
