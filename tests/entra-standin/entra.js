'use strict';
// A STAND-IN for Microsoft Entra ID's token endpoint and for a Kubernetes cluster's
// OIDC issuer, for orderly's tests only (Node.js built-ins, no dependencies). Workload
// identity works this way: the cluster signs a service account token (a JWT whose
// issuer is the cluster's OIDC issuer, audience api://AzureADTokenExchange) into a file
// of the pod; the client posts it as a client assertion to Entra ID's token endpoint;
// Entra ID checks it against the federated credentials of the identity named by the
// client id and answers with an access token for the asked scope (a JWT Entra signs).
// The services (the Service Bus stand-in, the PostgreSQL stand-in) check that access
// token with this stand-in's public key.
//
// It is NOT Entra ID: it checks what the tests need (signature, issuer, subject,
// audience, time range of the assertion; tenant; a known client id) and answers with the
// error codes Entra ID uses for those cases (AADSTS...), so that the client's errors can
// be checked for naming the cause.
//
// HTTPS (STANDIN_TLS_CERT / STANDIN_TLS_KEY, PEM files) on 127.0.0.1, a port of its own:
//   POST /<tenant>/oauth2/v2.0/token  (client credentials with a JWT client assertion)
// Control (HTTP on 127.0.0.1; both ports printed as JSON on the first line of stdout):
//   POST /identities {"client_id", "oid", "subject"}   an identity, federated with the
//        issuer's token for `subject` (system:serviceaccount:<namespace>:<name>)
//   POST /service-account-token {"subject", "audience"?, "lifetime_s"?}  -> {"token"}
//        as the cluster signs one (audience api://AzureADTokenExchange by default)
//   POST /lifetime {"seconds"}   how long access tokens issued from now on last
//   POST /down {"on"}            the token endpoint answers 503 while on
//   POST /stats -> {"requests", "issued", "refused", "last_error"}
//   POST /jwk -> Entra's public signing key (JWK), for the services that check tokens

const https = require('https');
const http = require('http');
const crypto = require('crypto');
const fs = require('fs');

const TENANT = process.env.STANDIN_TENANT || '72f988bf-86f1-41af-91ab-2d7cd011db47';
const ISSUER = `https://oidc.standin.invalid/${crypto.randomUUID()}/`;
const EXCHANGE_AUDIENCE = 'api://AzureADTokenExchange';
const ASSERTION_TYPE = 'urn:ietf:params:oauth:client-assertion-type:jwt-bearer';

const clusterKey = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const entraKey = crypto.generateKeyPairSync('ec', { namedCurve: 'P-256' });
const ENTRA_KID = 'standin-entra-1';

const identities = new Map(); // client_id -> { oid, subjects: Set }
let lifetime = 3600;
let down = false;
const stats = { requests: 0, issued: 0, refused: 0, last_error: null };

const b64u = (data) => Buffer.from(data).toString('base64url');
const nowS = () => Math.floor(Date.now() / 1000);

function sign(key, kid, claims) {
  const input = `${b64u(JSON.stringify({ alg: 'ES256', typ: 'JWT', kid }))}.${b64u(JSON.stringify(claims))}`;
  const signature = crypto.sign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' });
  return `${input}.${b64u(signature)}`;
}

// The claims of `token` if `publicKey` signed it, else null.
function verified(publicKey, token) {
  const parts = String(token || '').split('.');
  if (parts.length !== 3) return null;
  try {
    const ok = crypto.verify('sha256', Buffer.from(`${parts[0]}.${parts[1]}`),
      { key: publicKey, dsaEncoding: 'ieee-p1363' }, Buffer.from(parts[2], 'base64url'));
    return ok ? JSON.parse(Buffer.from(parts[1], 'base64url').toString()) : null;
  } catch (_) {
    return null;
  }
}

function refuse(res, status, error, code, description) {
  stats.refused += 1;
  stats.last_error = `AADSTS${code}`;
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({
    error,
    error_description: `AADSTS${code}: ${description} Trace ID: ${crypto.randomUUID()} Correlation ID: ${crypto.randomUUID()} Timestamp: ${new Date().toISOString()}`,
    error_codes: [code],
    timestamp: new Date().toISOString(),
  }));
}

function token(req, res, form) {
  stats.requests += 1;
  if (down) {
    stats.refused += 1;
    stats.last_error = 'down';
    res.writeHead(503, { 'content-type': 'application/json' });
    return res.end(JSON.stringify({ error: 'temporarily_unavailable', error_description: 'AADSTS90033: A transient error has occurred. Please try again.' }));
  }
  const tenant = req.url.split('/')[1];
  if (tenant !== TENANT) {
    return refuse(res, 400, 'invalid_request', 90002, `Tenant '${tenant}' not found. Check to make sure you have the correct tenant ID and are signing into the correct cloud.`);
  }
  if (form.get('grant_type') !== 'client_credentials' || form.get('client_assertion_type') !== ASSERTION_TYPE) {
    return refuse(res, 400, 'invalid_request', 900144, 'The request body must contain the following parameter: client_assertion_type (jwt-bearer) with grant_type client_credentials.');
  }
  const clientId = form.get('client_id') || '';
  const identity = identities.get(clientId);
  if (!identity) {
    return refuse(res, 400, 'unauthorized_client', 700016, `Application with identifier '${clientId}' was not found in the directory '${tenant}'.`);
  }
  const assertion = verified(clusterKey.publicKey, form.get('client_assertion'));
  if (!assertion) {
    return refuse(res, 401, 'invalid_client', 5002727, 'Invalid JWT token: the client assertion failed signature validation.');
  }
  if (!(assertion.nbf <= nowS() + 300 && nowS() < assertion.exp)) {
    return refuse(res, 400, 'invalid_client', 700024, 'Client assertion is not within its valid time range.');
  }
  if (assertion.iss !== ISSUER || assertion.aud !== EXCHANGE_AUDIENCE || !identity.subjects.has(assertion.sub)) {
    return refuse(res, 400, 'invalid_request', 70021,
      `No matching federated identity record found for presented assertion. Assertion Issuer: '${assertion.iss}'. Assertion Subject: '${assertion.sub}'. Assertion Audience: '${assertion.aud}'.`);
  }
  const scope = form.get('scope') || '';
  if (!scope.endsWith('/.default')) {
    return refuse(res, 400, 'invalid_scope', 1002012, `The provided value for scope ${scope} is not valid. Client credential flows must have a scope value with /.default suffixed to the resource identifier (application ID URI).`);
  }
  const t = nowS();
  const access = sign(entraKey.privateKey, ENTRA_KID, {
    aud: scope.slice(0, -'/.default'.length),
    iss: `https://sts.windows.net/${TENANT}/`,
    iat: t, nbf: t, exp: t + lifetime,
    appid: clientId, oid: identity.oid, sub: identity.oid, tid: TENANT, idtyp: 'app',
  });
  stats.issued += 1;
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ token_type: 'Bearer', expires_in: lifetime, ext_expires_in: lifetime, access_token: access }));
}

function read(req, then) {
  let data = '';
  req.on('data', (c) => { data += c; });
  req.on('end', () => then(data));
}

const server = https.createServer({
  cert: fs.readFileSync(process.env.STANDIN_TLS_CERT),
  key: fs.readFileSync(process.env.STANDIN_TLS_KEY),
}, (req, res) => read(req, (data) => {
  if (req.method === 'POST' && /^\/[^/]+\/oauth2\/v2\.0\/token$/.test(req.url.split('?')[0])) {
    return token(req, res, new URLSearchParams(data));
  }
  res.writeHead(404, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ error: 'not_found' }));
}));

const control = http.createServer((req, res) => read(req, (data) => {
  const json = (status, body) => { res.writeHead(status, { 'content-type': 'application/json' }); res.end(JSON.stringify(body)); };
  try {
    const body = data ? JSON.parse(data) : {};
    if (req.method !== 'POST') return json(405, { error: 'POST only' });
    switch (req.url) {
      case '/identities': {
        const identity = identities.get(body.client_id) || { oid: body.oid, subjects: new Set() };
        identity.oid = body.oid;
        if (body.subject) identity.subjects.add(body.subject);
        identities.set(body.client_id, identity);
        return json(200, { ok: true });
      }
      case '/service-account-token': {
        const t = nowS();
        return json(200, {
          token: sign(clusterKey.privateKey, 'cluster-1', {
            iss: ISSUER, sub: body.subject, aud: body.audience || EXCHANGE_AUDIENCE,
            iat: t, nbf: t, exp: t + Number(body.lifetime_s || 3600),
          }),
        });
      }
      case '/lifetime': lifetime = Number(body.seconds); return json(200, { ok: true });
      case '/down': down = body.on !== false; return json(200, { ok: true });
      case '/stats': return json(200, stats);
      case '/jwk': return json(200, Object.assign(entraKey.publicKey.export({ format: 'jwk' }), { kid: ENTRA_KID }));
      default: return json(404, { error: 'unknown control request' });
    }
  } catch (e) {
    return json(400, { error: String(e) });
  }
}));

server.listen(0, '127.0.0.1', () => {
  control.listen(Number(process.env.STANDIN_CONTROL_PORT || 0), '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({
      port: server.address().port, control: control.address().port, tenant: TENANT, issuer: ISSUER,
    }) + '\n');
  });
});
