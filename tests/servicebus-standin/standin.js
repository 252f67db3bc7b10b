'use strict';
// A STAND-IN for Azure Service Bus, for orderly's tests only. No Service Bus emulator
// can run on our CI machines, so this small AMQP 1.0 broker speaks the part of the
// protocol the `azservicebus` client uses: SASL ANONYMOUS, the CBS put-token (answered
// with status 202 as the real service does), queue send links (single messages and
// Azure's batch format 0x80013700), peek-lock receive links (lock token in the delivery
// tag; x-opt-sequence-number, x-opt-enqueued-time, x-opt-locked-until annotations),
// complete / abandon / dead-letter dispositions answered with the real outcome or
// com.microsoft:message-lock-lost, the renew-lock and peek-message management
// operations, the maximum delivery count (to the $DeadLetterQueue sub-queue, which is
// peeked and received peek-lock like a queue), duplicate detection on message id, and
// scheduled messages.
//
// It is NOT Service Bus and does not define orderly's behaviour: the same transport
// conformance suite runs against orderly's own SQL queue on SQLite and PostgreSQL.
//
// Control (HTTP on 127.0.0.1, port printed on start): POST /queues/<name> with
// {"lock_ms", "max_delivery_count", "dedup_ms"} declares a queue (with `?if-missing`
// only when it does not exist; the answer's "created" says which); POST /clock with
// {"now_ms"} sets the broker's clock (tests move time with a manual clock).
// Misbehaviour on request, for the transport's robustness tests: POST /drop-connections
// cuts every AMQP connection (no close frame); POST /hang-attach/<entity> leaves every
// later attach to that entity unanswered; POST /late-attach/<entity> with {"ms", "times"}
// answers the next `times` attaches to it (every one without `times`) only after that
// many real milliseconds (POST /late-attach-stats says how many such answers went out); POST /hang-renew with {"on": true|false}
// leaves renew-lock requests unanswered.
// Entra ID: after POST /entra {"jwk"} the CBS put-token takes only Entra ID access tokens
// (type "jwt") signed by that key (the Entra stand-in's, tests/entra-standin), for the
// audience https://servicebus.azure.net, not expired; a SAS token is refused, as by a
// namespace whose local authentication is disabled. A link is then attached, and a
// management request answered, only for an identity granted a role that carries its
// claim (POST /grant {"oid", "role", "queue"?}: Azure Service Bus Data Owner, Sender or
// Receiver, on one queue or on the namespace); otherwise amqp:unauthorized-access, in
// Service Bus's words. A link whose token expires without a new put-token is closed
// with that error. POST /auth-stats answers {"put", "refused", "unauthorized",
// "expired", "last_refusal"}.
// TLS: with STANDIN_TLS_CERT and STANDIN_TLS_KEY (PEM files) it also listens for AMQPS
// on port 5671, as Service Bus does; POST /tls-stats answers how many TLS handshakes
// were attempted there and how the last failed (the client's alert, as Node reports it).

const rhea = require('rhea');
const Session = require('rhea/lib/session.js');
const terminus = require('rhea/lib/terminus.js');
const http = require('http');
const fs = require('fs');
const crypto = require('crypto');
const types = rhea.types;

const HOST = process.env.STANDIN_HOST || '127.0.0.2';
const BATCH_FORMAT = 0x80013700;
const LOCK_LOST = 'com.microsoft:message-lock-lost';
// The largest transfer taken: Service Bus Standard's 256 KB, or STANDIN_MAX_TRANSFER_BYTES.
const MAX_TRANSFER = Number(process.env.STANDIN_MAX_TRANSFER_BYTES || 256 * 1024);
const stats = { oversized: 0 };

// The broker's clock: real time until a test sets it, then frozen at what the test set
// (tests move time with a manual clock, so lock and schedule times are exact).
let frozenAt = null;
const now = () => (frozenAt === null ? Date.now() : frozenAt);

// How long a new message takes to reach its receivers, in real milliseconds
// (STANDIN_DELIVERY_DELAY_MS, 0 by default): the latency a remote broker's network adds
// between a send being accepted and its delivery. scripts/test's stress mode turns it on,
// so a case that expects a sent message at once, instead of waiting for it, fails here.
const DELIVERY_DELAY_MS = Number(process.env.STANDIN_DELIVERY_DELAY_MS || 0);

const queues = new Map();   // name -> queue
const connections = new Set(); // open AMQP connections (dropped on request)
const hungAttach = new Set();  // entities whose attaches are never answered
const lateAttach = new Map();  // entity -> { ms, times } before its attaches are answered
const lateStats = { answered: 0 };
let hangRenew = false;         // renew-lock requests left unanswered while set
const replyLinks = new WeakMap(); // connection -> (reply address -> sender link)
const deliveries = new Map(); // rhea delivery -> { queue, seq, token }

function queueOf(entity) {
  return queues.get(entity);
}

function declare(name, s) {
  const q = queues.get(name) || { name, seq: 0, messages: [], dead: [], dedup: new Map(), consumers: new Set(), deadConsumers: new Set() };
  q.lockMs = s.lock_ms; q.maxDeliveries = s.max_delivery_count; q.dedupMs = s.dedup_ms;
  queues.set(name, q);
  return q;
}

function entityOf(address) {
  if (!address) return '';
  return String(address).replace(/^(amqps?|sb):\/\/[^/]+\//, '');
}

// --- Entra ID (see the header) ---
let entra = null; // { key }: the public key that signs access tokens
const grants = []; // { oid, queue (null: the namespace), claims: Set }
const auths = new Map(); // connection -> Map(queue -> { oid, exp, expired })
const authLinks = new Map(); // connection -> Set of { link, queue }
const authStats = { put: 0, refused: 0, unauthorized: 0, expired: 0, last_refusal: null };
const ROLE_CLAIMS = {
  'Azure Service Bus Data Owner': ['Send', 'Listen', 'Manage'],
  'Azure Service Bus Data Sender': ['Send'],
  'Azure Service Bus Data Receiver': ['Listen'],
};
const SERVICEBUS_AUDIENCES = ['https://servicebus.azure.net', 'https://servicebus.azure.net/'];
// The queue an entity path belongs to (its sub-queue or management node stripped).
const queueOfEntity = (entity) => String(entity).replace(/\/\$(management|DeadLetterQueue).*$/, '');

// The claims of an Entra ID access token `token` put as `type`, or the refusal's text.
function tokenVerdict(type, token) {
  if (type !== 'jwt') return { refusal: 'Unauthorized access. Local authentication methods (SAS) are disabled for this namespace; use an Entra ID token.' };
  const parts = String(token || '').split('.');
  let claims = null;
  try {
    if (parts.length === 3 && crypto.verify('sha256', Buffer.from(`${parts[0]}.${parts[1]}`),
      { key: entra.key, dsaEncoding: 'ieee-p1363' }, Buffer.from(parts[2], 'base64url'))) {
      claims = JSON.parse(Buffer.from(parts[1], 'base64url').toString());
    }
  } catch (_) { claims = null; }
  if (!claims) return { refusal: 'InvalidSignature: The token has an invalid signature.' };
  if (!SERVICEBUS_AUDIENCES.includes(claims.aud)) return { refusal: `InvalidAudience: The token audience '${claims.aud}' is not valid for Service Bus.` };
  if (claims.exp * 1000 <= Date.now()) return { refusal: `ExpiredToken: The token is expired. Expiration time: '${new Date(claims.exp * 1000).toISOString()}'.` };
  return { claims };
}

// The error a link or request of `connection` to `entity` needing `claim` meets, or null.
function denied(connection, entity, claim) {
  if (!entra) return null;
  const queue = queueOfEntity(entity);
  const resource = `sb://${HOST}/${queue}`;
  const auth = (auths.get(connection) || new Map()).get(queue);
  let description = null;
  if (!auth || auth.exp * 1000 <= Date.now()) {
    description = `Unauthorized access. A valid token for '${resource}' is required (put-token on $cbs).`;
  } else if (!grants.some((g) => g.oid === auth.oid && (g.queue === null || g.queue === queue) && g.claims.has(claim))) {
    description = `Unauthorized access. '${claim}' claim(s) are required to perform this operation. Resource: '${resource}'. TrackingId:${crypto.randomUUID()}, SystemTracker:${HOST}:Queue:${queue}, Timestamp:${new Date().toISOString()}`;
  }
  if (!description) return null;
  authStats.unauthorized += 1;
  authStats.last_refusal = description;
  return { condition: 'amqp:unauthorized-access', description };
}

// Keeps `link` to be closed when the token it was authorized with expires.
function watchAuth(link, entity) {
  if (!entra) return;
  if (!authLinks.has(link.connection)) authLinks.set(link.connection, new Set());
  authLinks.get(link.connection).add({ link, queue: queueOfEntity(entity) });
}

// Closes the links of `connection` to `queue` that `auth`, now expired, authorized.
function expire(connection, queue, auth) {
  auth.expired = true;
  for (const watched of authLinks.get(connection) || []) {
    if (watched.queue !== queue || watched.link.is_closed()) continue;
    authStats.expired += 1;
    // Closed here, so no 'sender_close' comes: it is no longer a consumer.
    for (const q of queues.values()) {
      q.consumers.delete(watched.link);
      q.deadConsumers.delete(watched.link);
    }
    watched.link.close({ condition: 'amqp:unauthorized-access',
      description: `ExpiredToken: The token is expired. Expiration time: '${new Date(auth.exp * 1000).toISOString()}'.` });
  }
}

setInterval(() => {
  if (!entra) return;
  for (const [connection, byQueue] of auths) {
    for (const [queue, auth] of byQueue) {
      if (!auth.expired && auth.exp * 1000 <= Date.now()) expire(connection, queue, auth);
    }
  }
}, 100);

function accept(q, msg) {
  const t = now();
  const id = msg.message_id === undefined ? undefined : String(msg.message_id);
  if (q.dedupMs > 0 && id !== undefined) {
    for (const [k, exp] of q.dedup) if (exp <= t) q.dedup.delete(k);
    if (q.dedup.has(id)) return;
    q.dedup.set(id, t + q.dedupMs);
  }
  const ann = msg.message_annotations || {};
  const scheduled = ann['x-opt-scheduled-enqueue-time'];
  q.seq += 1;
  q.messages.push({
    seq: q.seq,
    msg,
    enqueuedAt: t,
    visibleAt: scheduled ? Math.max(t, new Date(scheduled).getTime()) : t,
    // Real time, not the broker's clock (which tests freeze): new messages are ready
    // in the order they came, so the queue stays first in, first out.
    readyAt: Date.now() + DELIVERY_DELAY_MS,
    deliveries: 0,
    lock: null,
  });
  if (DELIVERY_DELAY_MS > 0) setTimeout(() => pump(q), DELIVERY_DELAY_MS + 1);
}

function deadLetter(q, rec, reason, description) {
  q.messages = q.messages.filter((m) => m !== rec);
  rec.lock = null;
  q.dead.push({ rec, reason, description, at: now(), lock: null, deliveries: 0 });
}

function outgoing(q, rec, extraProps) {
  const m = rec.msg;
  const out = {
    // rhea takes header fields flat on the message. AMQP counts earlier failed
    // deliveries; Service Bus's DeliveryCount is that + 1.
    delivery_count: Math.max(rec.deliveries - 1, 0),
    message_annotations: {
      'x-opt-sequence-number': types.wrap_long(rec.seq),
      'x-opt-enqueued-time': types.wrap_timestamp(rec.enqueuedAt),
    },
    body: m.body,
  };
  for (const k of ['message_id', 'correlation_id', 'content_type', 'subject', 'to', 'reply_to']) {
    if (m[k] !== undefined) out[k] = m[k];
  }
  out.application_properties = Object.assign({}, m.application_properties || {}, extraProps || {});
  if (rec.lock) out.message_annotations['x-opt-locked-until'] = types.wrap_timestamp(rec.lock.until);
  return out;
}

// Credit left on a link once the deliveries already queued on it are counted: rhea
// consumes credit only when it transfers, and sends a session's deliveries strictly in
// order, so one queued delivery without credit would block every link of the session.
function budget(link) {
  const out = link.session.outgoing;
  let pending = 0;
  for (let id = out.next_pending_delivery; id < out.next_delivery_id; id++) {
    const d = out.deliveries.by_id(id);
    if (d && d.link === link) pending++;
  }
  return link.credit - pending;
}

function pump(q) {
  const t = now();
  for (const rec of q.messages) {
    if (rec.lock && rec.lock.until <= t) rec.lock = null;
  }
  for (const link of q.consumers) {
    while (budget(link) > 0) {
      const ready = Date.now();
      const rec = q.messages.find((r) => !r.lock && r.visibleAt <= t && r.readyAt <= ready);
      if (!rec) break;
      if (rec.deliveries >= q.maxDeliveries) {
        deadLetter(q, rec, 'MaxDeliveryCountExceeded',
          `Message could not be consumed after ${q.maxDeliveries} delivery attempts.`);
        continue;
      }
      rec.deliveries += 1;
      const token = crypto.randomBytes(16);
      rec.lock = { token: token.toString('hex'), until: t + q.lockMs };
      const delivery = link.send(outgoing(q, rec), token);
      deliveries.set(delivery, { queue: q.name, seq: rec.seq, token: rec.lock.token });
    }
  }
}

// The dead-letter sub-queue's receivers: each dead letter not held is delivered
// peek-lock; completing it removes it, abandoning it puts it back.
function pumpDead(q) {
  const t = now();
  for (const d of q.dead) if (d.lock && d.lock.until <= t) d.lock = null;
  for (const link of q.deadConsumers) {
    while (budget(link) > 0) {
      const d = q.dead.find((x) => !x.lock);
      if (!d) break;
      d.deliveries += 1;
      const token = crypto.randomBytes(16);
      d.lock = { token: token.toString('hex'), until: t + q.lockMs };
      const out = outgoing(q, d.rec, { DeadLetterReason: d.reason, DeadLetterErrorDescription: d.description });
      out.delivery_count = Math.max(d.deliveries - 1, 0);
      out.message_annotations['x-opt-locked-until'] = types.wrap_timestamp(d.lock.until);
      const delivery = link.send(out, token);
      deliveries.set(delivery, { queue: q.name, seq: d.rec.seq, token: d.lock.token, dead: true });
    }
  }
}

function pumpAll() {
  for (const q of queues.values()) { pump(q); pumpDead(q); }
}

function settle(context, handle, handleDead) {
  const info = deliveries.get(context.delivery);
  deliveries.delete(context.delivery);
  if (info && info.dead) {
    const dq = queueOf(info.queue);
    const d = dq && dq.dead.find((x) => x.rec.seq === info.seq);
    if (!d || !d.lock || d.lock.token !== info.token || d.lock.until <= now()) {
      context.delivery.update(true, rhea.message.rejected({ error: { condition: LOCK_LOST,
        description: 'The lock supplied is invalid.' } }).described());
      return;
    }
    handleDead(dq, d);
    pumpDead(dq);
    return;
  }
  const q = info && queueOf(info.queue);
  const rec = q && q.messages.find((r) => r.seq === info.seq);
  if (!rec || !rec.lock || rec.lock.token !== info.token || rec.lock.until <= now()) {
    context.delivery.update(true, rhea.message.rejected({ error: { condition: LOCK_LOST,
      description: 'The lock supplied is invalid. Either the lock expired, or the message has already been removed from the queue.' } }).described());
    return;
  }
  handle(q, rec);
  pump(q);
}

const debug = (...args) => { if (process.env.STANDIN_DEBUG) console.error('[stand-in]', ...args); };

function respond(connection, request, status, body, extra) {
  // Every client uses the same reply address ('cbs-client-node'): look it up per connection.
  const link = (replyLinks.get(connection) || new Map()).get(request.reply_to);
  debug('respond', request.reply_to, status, !!link, link && link.credit);
  if (!link) return;
  const props = Object.assign({ statusCode: types.wrap_int(status), 'status-code': types.wrap_int(status) }, extra || {});
  link.send({ correlation_id: request.message_id, application_properties: props, body });
}

function management(connection, entity, request) {
  const op = (request.application_properties || {}).operation;
  const base = entity.replace(/\/\$management$/, '');
  const dlq = base.endsWith('/$DeadLetterQueue');
  const q = queueOf(dlq ? base.replace(/\/\$DeadLetterQueue$/, '') : base);
  if (!q) return respond(connection, request, 404, null, { 'status-description': `entity ${base} not found` });
  const body = request.body || {};
  if (op === 'com.microsoft:renew-lock') {
    if (hangRenew) return; // misbehaving on purpose: never answered
    const expirations = [];
    for (const tok of body['lock-tokens'] || []) {
      const hex = Buffer.from(tok).toString('hex');
      const rec = q.messages.find((r) => r.lock && r.lock.token === hex && r.lock.until > now());
      if (!rec) {
        return respond(connection, request, 410, null, { 'status-description': 'The lock supplied is invalid.', errorCondition: LOCK_LOST });
      }
      rec.lock.until = now() + q.lockMs;
      expirations.push(rec.lock.until);
    }
    return respond(connection, request, 200, types.wrap_map({ expirations: types.wrap_array(expirations, 0x83) }));
  }
  if (op === 'com.microsoft:peek-message') {
    const from = Number(body['from-sequence-number'] || 0);
    const count = Number(body['message-count'] || 1);
    const source = dlq ? q.dead.map((d) => ({ d, seq: d.rec.seq })) : q.messages.map((r) => ({ r, seq: r.seq }));
    const picked = source.filter((x) => x.seq >= from).sort((a, b) => a.seq - b.seq).slice(0, count);
    if (picked.length === 0) return respond(connection, request, 204, null);
    const messages = picked.map((x) => {
      const m = x.d
        ? outgoing(q, x.d.rec, { DeadLetterReason: x.d.reason, DeadLetterErrorDescription: x.d.description })
        : outgoing(q, x.r);
      return types.wrap_map({ message: types.wrap_binary(rhea.message.encode(m)) });
    });
    return respond(connection, request, 200, types.wrap_map({ messages: types.wrap_list(messages) }));
  }
  return respond(connection, request, 400, null, { 'status-description': `operation ${op} is not supported by the stand-in` });
}

// Misbehaving on purpose: an attach to an entity in `hungAttach` is never answered
// (as a broker whose session ended does), so the client's attach waits forever.
const onAttach = Session.prototype.on_attach;
Session.prototype.on_attach = function (frame) {
  const p = frame.performative;
  // role true: the peer is a receiver, so the entity is the source's address.
  const t = terminus.unwrap(p.role ? p.source : p.target);
  if (hungAttach.size && t && hungAttach.has(entityOf(t.address))) return;
  const late = t && lateAttach.get(entityOf(t.address));
  if (late && late.times > 0) {
    late.times -= 1;
    // Answered after the client may have given up on it (a slow broker).
    setTimeout(() => {
      try { onAttach.call(this, frame); } finally { lateStats.answered += 1; }
    }, late.ms);
    return;
  }
  return onAttach.call(this, frame);
};

const container = rhea.create_container({
  id: 'orderly-servicebus-standin', autosettle: false, autoaccept: false, treat_modified_as_released: false,
});
container.sasl_server_mechanisms.enable_anonymous();

// Refuse a link as a broker does: answer the attach with no terminus on our side,
// then detach with the error.
function refuse(link, entity, error) {
  if (link.is_receiver()) link.local.attach.target = null; else link.local.attach.source = null;
  link.open();
  link.close(error || { condition: 'amqp:not-found', description: `The messaging entity '${entity}' could not be found.` });
}

// Links to entities carry an amqp://host/ URL; management and CBS request links name
// their node ('$cbs', '<entity>/$management'); reply links name a client node.
const isEntityUrl = (address) => /^amqps?:\/\//.test(String(address || ''));

// Answer an attach with the same terminus addresses, as a broker does (the client
// refuses an attach without them).
function mirror(link) {
  const remote = link.remote.attach;
  if (remote.source) link.set_source({ address: remote.source.address });
  if (remote.target) link.set_target({ address: remote.target.address });
  // Peek-lock receivers ask for rcv-settle-mode "second": the broker answers each
  // disposition with the outcome (how a lost lock is reported).
  if (remote.rcv_settle_mode !== undefined) link.local.attach.rcv_settle_mode = remote.rcv_settle_mode;
  if (remote.snd_settle_mode !== undefined) link.local.attach.snd_settle_mode = remote.snd_settle_mode;
}

container.on('receiver_open', (context) => {
  mirror(context.receiver);
  const address = context.receiver.remote.attach.target && context.receiver.remote.attach.target.address;
  const entity = entityOf(address);
  if (!isEntityUrl(address)) return;
  const unauthorized = denied(context.connection, entity, 'Send');
  if (unauthorized) return refuse(context.receiver, entity, unauthorized);
  if (!queueOf(entity)) return refuse(context.receiver, entity);
  watchAuth(context.receiver, entity);
});

container.on('sender_open', (context) => {
  mirror(context.sender);
  const address = context.sender.remote.attach.source && context.sender.remote.attach.source.address;
  if (!isEntityUrl(address)) {
    // A reply link: the client's node address is the link's target (its reply_to).
    const target = context.sender.remote.attach.target && context.sender.remote.attach.target.address;
    if (!replyLinks.has(context.connection)) replyLinks.set(context.connection, new Map());
    replyLinks.get(context.connection).set(target, context.sender);
    return;
  }
  const entity = entityOf(address);
  const unauthorized = denied(context.connection, entity, 'Listen');
  if (unauthorized) return refuse(context.sender, entity, unauthorized);
  watchAuth(context.sender, entity);
  const q = queueOf(entity);
  if (q) {
    q.consumers.add(context.sender);
    return pump(q);
  }
  // A receiver of the dead-letter sub-queue: its dead letters are delivered peek-lock.
  const parent = entity.endsWith('/$DeadLetterQueue') && queueOf(entity.replace(/\/\$DeadLetterQueue$/, ''));
  if (parent) {
    parent.deadConsumers.add(context.sender);
    return pumpDead(parent);
  }
  refuse(context.sender, entity);
});

container.on('sendable', (context) => {
  for (const q of queues.values()) {
    if (q.consumers.has(context.sender)) pump(q);
    if (q.deadConsumers.has(context.sender)) pumpDead(q);
  }
});

// A link that closes is no longer a consumer (what it held stays locked until the
// lock expires, as on the broker); a connection that ends takes all of its links.
container.on('sender_close', (context) => {
  for (const q of queues.values()) {
    q.consumers.delete(context.sender);
    q.deadConsumers.delete(context.sender);
  }
});
for (const ev of ['connection_close', 'disconnected']) {
  container.on(ev, (context) => {
    for (const q of queues.values()) {
      for (const l of q.consumers) if (l.connection === context.connection) q.consumers.delete(l);
      for (const l of q.deadConsumers) if (l.connection === context.connection) q.deadConsumers.delete(l);
    }
  });
}

container.on('message', (context) => {
  const entity = entityOf(context.receiver.remote.attach.target && context.receiver.remote.attach.target.address);
  const msg = context.message;
  if (entity === '$cbs') {
    context.delivery.accept();
    if (entra) {
      const props = msg.application_properties || {};
      const verdict = tokenVerdict(props.type, msg.body);
      if (verdict.refusal) {
        authStats.refused += 1;
        authStats.last_refusal = verdict.refusal;
        return respond(context.connection, msg, 401, null, { 'status-description': verdict.refusal });
      }
      if (!auths.has(context.connection)) auths.set(context.connection, new Map());
      const queue = queueOfEntity(entityOf(props.name));
      const previous = auths.get(context.connection).get(queue);
      // A renewal that comes after the token it replaces expired is too late: the links
      // it authorized are closed, as Service Bus closes them at the expiry.
      if (previous && !previous.expired && previous.exp * 1000 <= Date.now()) expire(context.connection, queue, previous);
      auths.get(context.connection).set(queue, { oid: verdict.claims.oid, exp: verdict.claims.exp, expired: false });
      authStats.put += 1;
    }
    return respond(context.connection, msg, 202, null, { 'status-description': 'Accepted' });
  }
  if (entity.endsWith('/$management')) {
    context.delivery.accept();
    const unauthorized = denied(context.connection, entity, 'Listen');
    if (unauthorized) return respond(context.connection, msg, 401, null, { 'status-description': unauthorized.description });
    return management(context.connection, entity, msg);
  }
  const q = queueOf(entity);
  if (!q) return context.delivery.reject({ condition: 'amqp:not-found', description: `no queue ${entity}` });
  // As Service Bus Standard: a transfer (one message, or one batch) over 256 KB is
  // refused whole, and nothing of it is enqueued.
  const size = Buffer.isBuffer(msg) ? msg.length : rhea.message.encode(msg).length;
  if (size > MAX_TRANSFER) {
    stats.oversized += 1;
    return context.delivery.reject({ condition: 'amqp:link:message-size-exceeded',
      description: `The received message (${size} bytes) exceeds the limit (${MAX_TRANSFER} bytes) of ${entity}.` });
  }
  if (context.delivery.format === BATCH_FORMAT) {
    // rhea hands over other formats undecoded: the envelope's data sections each hold
    // one encoded message.
    const body = rhea.message.decode(msg).body;
    const parts = body.multiple ? body.content : [body.content];
    for (const part of parts) accept(q, rhea.message.decode(Buffer.from(part)));
  } else {
    accept(q, msg);
  }
  context.delivery.accept();
  pump(q);
});

container.on('accepted', (context) => settle(context, (q, rec) => {
  q.messages = q.messages.filter((r) => r !== rec);
  context.delivery.update(true, rhea.message.accepted().described());
}, (q, d) => {
  q.dead = q.dead.filter((x) => x !== d);
  context.delivery.update(true, rhea.message.accepted().described());
}));

const putBack = (context, outcome) => (q, d) => {
  d.lock = null;
  context.delivery.update(true, outcome);
};

container.on('modified', (context) => settle(context, (q, rec) => {
  rec.lock = null;
  rec.visibleAt = now();
  context.delivery.update(true, rhea.message.modified({}).described());
}, putBack(context, rhea.message.modified({}).described())));

container.on('released', (context) => settle(context, (q, rec) => {
  rec.lock = null;
  rec.visibleAt = now();
  context.delivery.update(true, rhea.message.released().described());
}, putBack(context, rhea.message.released().described())));

container.on('rejected', (context) => settle(context, (q, rec) => {
  const error = (context.delivery.remote_state && context.delivery.remote_state.error) || {};
  const info = error.info || {};
  deadLetter(q, rec, info.DeadLetterReason || '', info.DeadLetterErrorDescription || '');
  // Echo the outcome without its info map: rhea would re-encode it with string keys,
  // which a client expecting AMQP fields (symbol keys) cannot read.
  const echoed = { condition: error.condition, description: error.description };
  context.delivery.update(true, rhea.message.rejected({ error: echoed }).described());
}, (q, d) => {
  // A dead letter dead-lettered again stays where it is.
  d.lock = null;
  const error = (context.delivery.remote_state && context.delivery.remote_state.error) || {};
  context.delivery.update(true, rhea.message.rejected({ error: { condition: error.condition, description: error.description } }).described());
}));

container.on('error', (e) => console.error('stand-in error:', e && (e.message || e.error || JSON.stringify(e.condition || e)), e && e.stack));
container.on('connection_open', (context) => connections.add(context.connection));
for (const ev of ['connection_close', 'disconnected']) {
  container.on(ev, (context) => {
    connections.delete(context.connection);
    auths.delete(context.connection);
    authLinks.delete(context.connection);
  });
}

setInterval(pumpAll, 20);

const control = http.createServer((req, res) => {
  let data = '';
  req.on('data', (c) => { data += c; });
  req.on('end', () => {
    try {
      const body = data ? JSON.parse(data) : {};
      if (req.method === 'POST' && req.url.startsWith('/queues/')) {
        // `?if-missing`: create the queue only if it does not exist (an existing one
        // keeps its settings); the answer says whether it was created.
        const [path, query] = req.url.split('?');
        const name = decodeURIComponent(path.slice('/queues/'.length));
        const created = !(query === 'if-missing' && queues.has(name));
        if (created) declare(name, body);
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ ok: true, created }));
      } else if (req.method === 'POST' && req.url === '/drop-connections') {
        // A network blip: every AMQP connection cut at once, without a close frame.
        for (const c of connections) {
          for (const q of queues.values()) {
            for (const l of q.consumers) if (l.connection === c) q.consumers.delete(l);
            for (const l of q.deadConsumers) if (l.connection === c) q.deadConsumers.delete(l);
          }
          if (c.socket) c.socket.destroy();
        }
        connections.clear();
      } else if (req.method === 'POST' && req.url.startsWith('/hang-attach/')) {
        hungAttach.add(decodeURIComponent(req.url.slice('/hang-attach/'.length)));
      } else if (req.method === 'POST' && req.url.startsWith('/late-attach/')) {
        lateAttach.set(decodeURIComponent(req.url.slice('/late-attach/'.length)),
          { ms: Number(body.ms), times: body.times === undefined ? Infinity : Number(body.times) });
      } else if (req.method === 'POST' && req.url === '/late-attach-stats') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify(lateStats));
      } else if (req.method === 'POST' && req.url === '/hang-renew') {
        hangRenew = body.on !== false;
      } else if (req.method === 'POST' && req.url === '/tls-stats') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify(tlsStats));
      } else if (req.method === 'POST' && req.url === '/entra') {
        entra = { key: crypto.createPublicKey({ key: body.jwk, format: 'jwk' }) };
      } else if (req.method === 'POST' && req.url === '/grant') {
        const claims = ROLE_CLAIMS[body.role];
        if (!claims) { res.writeHead(400); return res.end(`no such role ${body.role}`); }
        grants.push({ oid: body.oid, queue: body.queue || null, claims: new Set(claims) });
      } else if (req.method === 'POST' && req.url === '/auth-stats') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify(authStats));
      } else if (req.method === 'POST' && req.url === '/clock') {
        frozenAt = Number(body.now_ms);
        pumpAll();
      } else if (req.url !== '/health') {
        res.writeHead(404); return res.end('unknown control request');
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"ok":true}');
    } catch (e) {
      res.writeHead(400); res.end(String(e));
    }
  });
});

const tlsStats = { handshakes: 0, secured: 0, last_error: null };
if (process.env.STANDIN_TLS_CERT) {
  const server = container.listen({
    host: HOST,
    port: 5671,
    transport: 'tls',
    cert: fs.readFileSync(process.env.STANDIN_TLS_CERT),
    key: fs.readFileSync(process.env.STANDIN_TLS_KEY),
  });
  server.on('connection', () => { tlsStats.handshakes += 1; });
  server.on('secureConnection', () => { tlsStats.secured += 1; });
  server.on('tlsClientError', (e) => { tlsStats.last_error = String(e && e.message || e); });
}

container.listen({ host: HOST, port: 5672 }).on('listening', () => {
  control.listen(Number(process.env.STANDIN_CONTROL_PORT || 0), '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ amqp: `${HOST}:5672`, control: control.address().port }) + '\n');
  });
});
