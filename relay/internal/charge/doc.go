// Package charge is the compiled form of a policy.Config, shared by the
// gate (package relay) and the hooks (package relay/hooks) so that the two
// cannot disagree on what a frame costs: Compile validates a Config and
// prepares every set of windows (ratelimit.Windows) with its key suffixes,
// split into the windows that enforce and those in shadow, and REQ's
// windows for every filter count, since a REQ of n filters costs n REQs.
// A Subject is who pays for one connection's frames, and Subject.Event the
// one EVENT rule (who the actor is, the allow-listed author's exemption,
// the windows before the actor quota); Identity turns a request into its
// client; Observer reports decisions nil-safely.
//
// It is internal: its names are the gate's and the hooks' working parts,
// not API.
package charge
