package charge

import (
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// Observer is a policy.Observer with nil-safe calls: a nil *Observer, or a
// nil callback, observes nothing.
type Observer policy.Observer

func (o *Observer) ReportFrame(client string, t wire.Type, out policy.Outcome) {
	if o != nil && o.Frame != nil {
		o.Frame(client, t, out)
	}
}

func (o *Observer) ReportCut(reason string) {
	if o != nil && o.Cut != nil {
		o.Cut(reason)
	}
}

func (o *Observer) ReportConnection(client string, out policy.Outcome) {
	if o != nil && o.Connection != nil {
		o.Connection(client, out)
	}
}

func (o *Observer) ReportOpen(delta int) {
	if o != nil && o.Open != nil {
		o.Open(delta)
	}
}

func (o *Observer) ReportSent(client string, bytes, events int64) {
	if o != nil && o.Sent != nil {
		o.Sent(client, bytes, events)
	}
}

func (o *Observer) ReportReadSpent(client string) {
	if o != nil && o.ReadSpent != nil {
		o.ReadSpent(client)
	}
}
