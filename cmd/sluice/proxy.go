package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/sluice-relay/sluice/cmd/sluice/internal/nip11"
)

// proxyFront routes a request in proxy mode: NIP-11 to info, which merges
// sluice's limits into the upstream's document; everything else to gated,
// which gates WebSocket upgrades and passes every other request to the
// upstream unchanged (methods, paths, bodies, NIP-86 management calls,
// streamed responses), with the client-address headers set as on upgrades.
func proxyFront(info, gated http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if nip11.IsRequest(r) {
			info.ServeHTTP(w, r)
			return
		}
		gated.ServeHTTP(w, r)
	})
}

// runProxy runs the gate in front of the relay at cfg.Upstream until ctx is
// done. NIP-11 requests get the upstream's own document with sluice's
// limits merged in; if the upstream cannot be asked, a document built from
// the info section of the config.
// load re-reads the configuration at SIGHUP (nil: no reload).
//
// The upstream's document is fetched once a minute whether or not anyone
// asks for it (nip11.Handler.Keep), and the same fetch tells the gate which
// NIPs the relay does: a COUNT is forwarded only while the document
// served lists NIP-45, a NEG-OPEN only while it lists NIP-77; otherwise the
// gate answers them "unsupported: …", so what the document promises is
// what works through the proxy. A failed fetch changes neither: the last
// document read stays served and in force. Until one has been read (the
// upstream down at start, or serving no NIP-11 at all) the fallback served
// lists no NIPs and both are refused.
func runProxy(ctx context.Context, cfg *config, logger *slog.Logger, load func() (*config, error)) error {
	var nips nip11.NIPs
	gate, parts, m, err := newGate(ctx, cfg, logger, nil, nips.Supports)
	if err != nil {
		return err
	}
	gated, err := gate.Proxy(cfg.Upstream)
	if err != nil {
		parts.close()
		return fmt.Errorf("%w: upstream: %v", errConfig, err)
	}

	lim := nip11Limitation(cfg, parts.policy)
	client := &http.Client{Timeout: nip11.DefaultTimeout}
	lastErr := "" // OnError's and OnDocument's, which one fetch at a time calls
	info := &nip11.Handler{
		Fetch: func(ctx context.Context) ([]byte, error) {
			return nip11.Fetch(ctx, client, cfg.Upstream)
		},
		Limitation: lim,
		Fallback:   proxyFallbackNIP11(cfg),
		// Keep asks every few seconds while the upstream serves no
		// document: the same failure is logged once at warn level.
		OnError: func(err error) {
			level := slog.LevelWarn
			if err.Error() == lastErr {
				level = slog.LevelDebug
			}
			lastErr = err.Error()
			logger.Log(context.Background(), level, "upstream NIP-11 unavailable; serving the last good or built-in document", "err", err)
		},
		OnDocument: func(doc []byte) {
			lastErr = ""
			if nips.Learn(doc) {
				logger.Info("upstream NIP-11 read", "count_nip45", nips.Supports(45), "negentropy_nip77", nips.Supports(77))
			}
		},
	}
	go info.Keep(ctx)

	if load != nil {
		rl := &reloader{load: load, start: cfg, gate: gate, parts: parts, m: m, logger: logger,
			nip11: publishNIP11(info, func(c *config, lim nip11.Limitation) ([]byte, error) {
				return proxyFallbackNIP11(c), nil
			})}
		go rl.run(ctx)
	}
	handler := proxyFront(info, gated)
	logger.Info("sluice proxy", "version", buildVersion(), "store", parts.store, "upstream", cfg.Upstream)
	checks := []readyCheck{parts.ready, upstreamCheck(cfg.Upstream)}
	return serve(ctx, cfg, logger, handler, m, gate, checks, func(context.Context) error { return parts.close() })
}

// proxyFallbackNIP11 is the document sluice proxy serves when the upstream
// has none to give: the info section.
func proxyFallbackNIP11(cfg *config) []byte {
	// The fallback says only what sluice knows: no supported_nips (those
	// are the upstream's), no empty fields, and no limitation (that is
	// the relay's; sluice's own bounds are published as sluice's, in
	// rate_limits.bounds, by the merge).
	doc := map[string]any{
		"software": sluiceURL,
		"version":  buildVersion(),
	}
	for k, v := range map[string]string{"name": cfg.Info.Name, "description": cfg.Info.Description,
		"contact": cfg.Info.Contact, "pubkey": cfg.Info.Pubkey, "icon": cfg.Info.Icon} {
		if v != "" {
			doc[k] = v
		}
	}
	fallback, _ := json.Marshal(doc) // a map of strings and ints
	return fallback
}
