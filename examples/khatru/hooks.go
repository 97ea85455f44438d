package main

import (
	"context"

	"github.com/fiatjaf/khatru"

	"github.com/sluice-relay/sluice/relay/hooks"
)

// withHooks puts sluice's limits into rl's own hook slots.
func withHooks(rl *khatru.Relay, opts hooks.Options) error {
	h, err := hooks.New(opts)
	if err != nil {
		return err
	}
	// The TCP peer (peerAddr, and nil for the upgrade request's): this
	// program serves clients directly. Behind a proxy that overwrites
	// X-Forwarded-For, khatru.GetIP and khatru.GetIPFromRequest would do.
	k := h.Khatru(peerAddr, nil, khatru.GetAuthed)
	rl.RejectConnection = append(rl.RejectConnection, k.RejectConnection)
	rl.OnConnect = append(rl.OnConnect, k.OnConnect)
	rl.RejectEvent = append(rl.RejectEvent, k.RejectEvent)
	rl.RejectFilter = append(rl.RejectFilter, k.RejectFilter)
	rl.RejectCountFilter = append(rl.RejectCountFilter, k.RejectCountFilter)
	if k.OnEventSaved != nil {
		rl.OnEventSaved = append(rl.OnEventSaved, k.OnEventSaved)
	}
	rl.OverwriteRelayInformation = append(rl.OverwriteRelayInformation, k.OverwriteRelayInformation)
	return nil
}

// peerAddr returns the TCP peer of the connection behind ctx ("host:port"),
// or "" for a call that has none (khatru's own AddEvent).
func peerAddr(ctx context.Context) string {
	if ws := khatru.GetConnection(ctx); ws != nil {
		return ws.Request.RemoteAddr
	}
	return ""
}
