package relay

import (
	"errors"
	"net"
	"os"
	"time"
)

// writeProgressing writes p to conn, waiting as long as the client keeps
// reading: it gives up, with the write's timeout error, only when the
// socket has made no progress at all for stall — no byte of p taken and,
// where the system says, no byte the socket holds acknowledged by the
// client. A blocked write resumes only once the kernel has freed a good
// part of a send buffer that may have grown to megabytes, which a client
// reading a few KB/s takes far longer than stall to do: counting only
// bytes taken would cut it while it reads. limit, when not zero, is a
// deadline of the caller's own that ends the write whatever the progress.
//
// A client is therefore cut here only when it reads nothing for stall;
// one that reads slowly is cut, if ever, by what waits for it growing past
// the queue's bound (Options.QueueBytes), which the callers check.
func writeProgressing(conn net.Conn, p []byte, stall time.Duration, limit time.Time) (int, error) {
	done := 0
	unsent, known := unsentBytes(conn)
	for {
		d := time.Now().Add(stall)
		capped := !limit.IsZero() && limit.Before(d)
		if capped {
			d = limit
		}
		if err := conn.SetWriteDeadline(d); err != nil {
			return done, err
		}
		n, err := conn.Write(p[done:])
		done += n
		if err == nil || capped || !isTimeout(err) {
			return done, err
		}
		now, ok := unsentBytes(conn)
		progressed := n > 0 || (known && ok && now < unsent)
		unsent, known = now, ok
		if !progressed {
			return done, err
		}
	}
}

// isTimeout reports whether a write to a client failed at its deadline
// (gorilla hands a timeout back as a net.Error of its own, not wrapped).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
