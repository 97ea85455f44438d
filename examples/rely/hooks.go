package main

import (
	"net/http"

	"github.com/pippellia-btc/rely"

	"github.com/sluice-relay/sluice/relay/hooks"
)

// withHooks puts sluice's limits into r's Reject hooks and wraps its
// On.Event so that saved events count against the actor quota. The hooks are
// prepended: rely runs its Reject hooks in order, and a refused event should
// cost no signature check.
func withHooks(r *rely.Relay, opts hooks.Options) (http.Handler, error) {
	h, err := hooks.New(opts)
	if err != nil {
		return nil, err
	}
	rh := hooks.Rely[rely.Client, rely.Stats](h, func(c rely.Client) string { return c.IP().String() }, nil)
	r.Reject.Connection.Prepend(rh.Connection)
	r.Reject.Event.Prepend(rh.Event)
	r.Reject.Req.Prepend(rh.Req)
	r.Reject.Count.Prepend(rh.Count)
	r.On.Event = rh.SaveEvent(r.On.Event)
	// rely's Client.IP believes True-Client-IP, X-Real-IP and
	// X-Forwarded-For from any peer. This program serves clients directly,
	// so the TCP peer is the client: drop the headers before rely reads
	// them. Behind a proxy that overwrites them, serve r itself.
	return withoutHeaders(r, "True-Client-IP", "X-Real-IP", "X-Forwarded-For"), nil
}
