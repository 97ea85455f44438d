// A Nostr relay not written in Go, for sluice's tests: @nostr-relay/core
// with its SQLite event store and its message validator, on ws, listening
// on a free loopback port that it prints as "listening <port>".
// RELAY_HOSTNAME, when set, turns its NIP-42 on (the host AUTH events must
// name). Started and stopped by internal/noderelay, for tests.
'use strict';
const { WebSocketServer } = require('ws');
const { NostrRelay } = require('@nostr-relay/core');
const { EventRepositorySqlite } = require('@nostr-relay/event-repository-sqlite');
const { Validator } = require('@nostr-relay/validator');

async function main() {
  const repo = new EventRepositorySqlite(':memory:');
  // Creates the tables: without it the first REQ fails with
  // "no such table: events" and ends the process.
  await repo.init();
  const relay = new NostrRelay(repo, { hostname: process.env.RELAY_HOSTNAME || undefined, logLevel: 3 });
  const validator = new Validator();
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0, maxPayload: 1 << 20 });
  wss.on('connection', (ws, req) => {
    relay.handleConnection(ws, req.socket.remoteAddress);
    ws.on('message', async (data) => {
      try {
        const msg = await validator.validateIncomingMessage(data);
        await relay.handleMessage(ws, msg);
      } catch (e) {
        // The validator refuses by NOTICE, as this relay does.
        ws.send(JSON.stringify(['NOTICE', 'invalid: ' + (e && e.message ? e.message : String(e))]));
      }
    });
    ws.on('close', () => relay.handleDisconnect(ws));
    ws.on('error', () => {});
  });
  wss.on('listening', () => process.stdout.write('listening ' + wss.address().port + '\n'));
  const stop = () => { wss.close(); repo.close && repo.close(); process.exit(0); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + '\n');
  process.exit(1);
});
