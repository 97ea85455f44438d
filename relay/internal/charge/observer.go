package charge

import (
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// Observer is a policy.Observer with nil-safe calls: a nil *Observer, or a
// nil callback, observes nothing.
type Observer policy.Observer

func (o *Observer) ReportFrame(t wire.Type, out policy.Outcome) {
	if o != nil && o.Frame != nil {
		o.Frame(t, out)
	}
}

func (o *Observer) ReportRefusal(client string, t wire.Type, out policy.Outcome) {
	if o != nil && o.Refusal != nil {
		o.Refusal(client, t, out)
	}
}

func (o *Observer) ReportCut(r policy.CutReason) {
	if o != nil && o.Cut != nil {
		o.Cut(r)
	}
}

func (o *Observer) ReportConnection(out policy.Outcome) {
	if o != nil && o.Connection != nil {
		o.Connection(out)
	}
}

func (o *Observer) ReportOpen(delta int) {
	if o != nil && o.Open != nil {
		o.Open(delta)
	}
}
