//go:build !unix

package redistest

// Pause skips the test: a server that keeps its port and connections and
// answers nothing needs SIGSTOP, which this system does not have.
func (s *Server) Pause() {
	s.tb.Helper()
	s.tb.Skip("redistest: Pause needs SIGSTOP")
}

// Resume does nothing: Pause never stopped the server.
func (s *Server) Resume() {}
