'use strict';
// A STAND-IN for Azure Database for PostgreSQL's Entra ID sign-in, for orderly's tests
// only (Node.js built-ins): a proxy in front of a real PostgreSQL that asks each client
// for a cleartext password, takes only an Entra ID access token (signed by the Entra ID
// stand-in's key, for the audience https://ossrdbms-aad.database.windows.net, not
// expired) whose object id is the one of the role the client names (as
// `pgaadauth_create_principal` maps a role to an identity), and then connects the client
// to the real server as its own user and passes every byte both ways. A refused token
// gets PostgreSQL's answer, FATAL 28P01 "password authentication failed for user ...".
// It refuses TLS ('N'): tests reach it over loopback.
//
// Environment: STANDIN_UPSTREAM (host:port of the real server), STANDIN_UPSTREAM_USER
// (the user it connects as there), STANDIN_JWK (the Entra ID stand-in's public key, JSON).
// Control (HTTP on 127.0.0.1): POST /principals {"user", "oid"}; POST /stats ->
// {"accepted", "refused", "last_refusal", "expires"} (expires: the exp of each accepted
// token, in order). Both ports are printed as JSON on the first line of stdout.

const net = require('net');
const http = require('http');
const crypto = require('crypto');

const [UP_HOST, UP_PORT] = (process.env.STANDIN_UPSTREAM || '127.0.0.1:5432').split(':');
const UP_USER = process.env.STANDIN_UPSTREAM_USER || 'postgres';
const KEY = crypto.createPublicKey({ key: JSON.parse(process.env.STANDIN_JWK), format: 'jwk' });
const AUDIENCE = 'https://ossrdbms-aad.database.windows.net';

const principals = new Map(); // user -> oid
const stats = { accepted: 0, refused: 0, last_refusal: null, expires: [] };

function claimsOf(token) {
  const parts = String(token).split('.');
  if (parts.length !== 3) return null;
  try {
    const ok = crypto.verify('sha256', Buffer.from(`${parts[0]}.${parts[1]}`),
      { key: KEY, dsaEncoding: 'ieee-p1363' }, Buffer.from(parts[2], 'base64url'));
    return ok ? JSON.parse(Buffer.from(parts[1], 'base64url').toString()) : null;
  } catch (_) {
    return null;
  }
}

function errorResponse(message) {
  const fields = Buffer.concat([
    Buffer.from('SFATAL\0VFATAL\0C28P01\0'),
    Buffer.from(`M${message}\0`),
    Buffer.from('\0'),
  ]);
  const head = Buffer.alloc(5);
  head.write('E', 0);
  head.writeInt32BE(fields.length + 4, 1);
  return Buffer.concat([head, fields]);
}

// The startup message's parameters, and the same message naming `user` instead.
function parseStartup(body) {
  const params = {};
  const items = body.subarray(4).toString('utf8').split('\0');
  for (let i = 0; i + 1 < items.length; i += 2) if (items[i]) params[items[i]] = items[i + 1];
  return params;
}
function startupFor(params, user) {
  const pairs = Object.entries(Object.assign({}, params, { user }))
    .map(([k, v]) => `${k}\0${v}\0`).join('') + '\0';
  const payload = Buffer.from(pairs);
  const msg = Buffer.alloc(8 + payload.length);
  msg.writeInt32BE(msg.length, 0);
  msg.writeInt32BE(196608, 4);
  payload.copy(msg, 8);
  return msg;
}

const server = net.createServer((client) => {
  let buffer = Buffer.alloc(0);
  let state = 'startup';
  let params = null;
  client.on('error', () => {});
  client.on('data', function onData(chunk) {
    buffer = Buffer.concat([buffer, chunk]);
    for (;;) {
      if (state === 'startup') {
        if (buffer.length < 8) return;
        const len = buffer.readInt32BE(0);
        if (buffer.length < len) return;
        const code = buffer.readInt32BE(4);
        const body = buffer.subarray(4, len);
        buffer = buffer.subarray(len);
        if (code === 80877103 || code === 80877104) { client.write('N'); continue; } // SSL, GSS: no
        if (code !== 196608) { client.destroy(); return; }
        params = parseStartup(body);
        const ask = Buffer.alloc(9);
        ask.write('R', 0); ask.writeInt32BE(8, 1); ask.writeInt32BE(3, 5); // cleartext password
        client.write(ask);
        state = 'password';
      } else if (state === 'password') {
        if (buffer.length < 5) return;
        const len = buffer.readInt32BE(1);
        if (buffer.length < len + 1) return;
        if (buffer[0] !== 'p'.charCodeAt(0)) { client.destroy(); return; }
        const token = buffer.subarray(5, len + 1).toString('utf8').replace(/\0$/, '');
        buffer = buffer.subarray(len + 1);
        const user = params.user;
        const claims = claimsOf(token);
        const refusal = !claims ? 'not a token signed by Entra ID'
          : claims.aud !== AUDIENCE ? `audience ${claims.aud}`
          : claims.exp * 1000 <= Date.now() ? 'expired'
          : principals.get(user) !== claims.oid ? `no role for object id ${claims.oid}`
          : null;
        if (refusal) {
          stats.refused += 1;
          stats.last_refusal = `${user}: ${refusal}`;
          client.end(errorResponse(`password authentication failed for user "${user}"`));
          return;
        }
        stats.accepted += 1;
        stats.expires.push(claims.exp);
        state = 'piped';
        client.removeListener('data', onData);
        client.pause();
        const upstream = net.connect(Number(UP_PORT), UP_HOST, () => {
          upstream.write(startupFor(params, UP_USER));
          if (buffer.length) upstream.write(buffer);
          client.pipe(upstream);
          upstream.pipe(client);
          client.resume();
        });
        upstream.on('error', () => client.destroy());
        client.on('close', () => upstream.destroy());
        upstream.on('close', () => client.destroy());
        return;
      } else {
        return;
      }
    }
  });
});

const control = http.createServer((req, res) => {
  let data = '';
  req.on('data', (c) => { data += c; });
  req.on('end', () => {
    const body = data ? JSON.parse(data) : {};
    const json = (status, answer) => { res.writeHead(status, { 'content-type': 'application/json' }); res.end(JSON.stringify(answer)); };
    if (req.url === '/principals') { principals.set(body.user, body.oid); return json(200, { ok: true }); }
    if (req.url === '/stats') return json(200, stats);
    return json(404, { error: 'unknown control request' });
  });
});

server.listen(0, '127.0.0.1', () => {
  control.listen(0, '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ port: server.address().port, control: control.address().port }) + '\n');
  });
});
