'use strict';
// scripts/bench's third reference: node-idempotency (@node-idempotency/core with its Redis
// storage adapter) in front of the same benchmark backend as the sidecar, on the same
// route, header and fingerprint fields as integration/bench/sidecar.yaml. Benchmark code,
// not part of the product; docs/performance.md says what it does and does not do
// compared with the sidecar.
//
//   node server.js --listen PORT --backend PORT --redis redis://127.0.0.1:PORT [--workers N]
//
// One process per worker (Node's cluster: the primary accepts connections and hands them
// round-robin to the workers, which each have their own Redis connection and keep-alive
// agent to the backend), as many as the sidecar has event-loop threads.
//
//   POST /orders   Idempotency-Key required; the library's onRequest (SET NX of an
//                  in-progress record, or GET of the recorded one), then the backend, then
//                  onResponse (SET of the completed record), then the answer
//   anything else  proxied to the backend unchanged (the pass-through reference)
const cluster = require('node:cluster');
const http = require('node:http');
const { Idempotency, IdempotencyError, IdempotencyErrorCodes } = require('@node-idempotency/core');
const { RedisStorageAdapter } = require('@node-idempotency/storage-adapter-redis');

function parseArgs(argv) {
  const opts = { workers: 1 };
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i];
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`${name} needs a value`);
    if (name === '--listen') opts.listen = Number(value);
    else if (name === '--backend') opts.backend = Number(value);
    else if (name === '--redis') opts.redis = value;
    else if (name === '--workers') opts.workers = Number(value);
    else throw new Error(`unknown option ${name}`);
  }
  if (!opts.listen || !opts.backend || !opts.redis || !(opts.workers >= 1)) {
    throw new Error('usage: server.js --listen PORT --backend PORT --redis URL [--workers N]');
  }
  return opts;
}

// The sidecar route's settings (integration/bench/sidecar.yaml), as far as the library
// has them.
const ROUTE = { method: 'POST', path: '/orders' };
const KEY_MAX_LENGTH = 255;
const RETENTION_MS = 24 * 3600 * 1000;
const WAIT_MS = 5000;
const MAX_REQUEST_BODY = 1024 * 1024;
const MAX_RESPONSE_BODY = 8 * 1024 * 1024;
const REPLAY_HEADERS = ['content-type', 'location', 'etag'];
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding',
  'te', 'trailer', 'upgrade', 'proxy-authorization', 'proxy-authenticate']);

// The sidecar's store policy: 2xx and 4xx, except 408, 425 and 429.
function storable(status) {
  return (status >= 200 && status < 300) ||
         (status >= 400 && status < 500 && status !== 408 && status !== 425 && status !== 429);
}

// The library fingerprints JSON.stringify(body) of whatever it is given (blake2s256), with
// no field selection and no canonical form. It is given the sidecar route's fingerprint
// fields, in a fixed order, with the route's default for currency, so that the same
// requests match and mismatch on both (except for key order inside the fields' values).
function fingerprintFields(body) {
  return {
    customer_id: body.customer_id,
    currency: body.currency === undefined ? 'EUR' : body.currency,
    amount: body.amount,
    items: body.items,
    shipping_address_id: body.shipping ? body.shipping.address_id : undefined,
  };
}

function readBody(stream, limit) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    stream.on('data', (chunk) => {
      size += chunk.length;
      if (size > limit) {
        reject(Object.assign(new Error('body too large'), { status: 413 }));
        stream.destroy();
        return;
      }
      chunks.push(chunk);
    });
    stream.on('end', () => resolve(Buffer.concat(chunks)));
    stream.on('error', reject);
  });
}

function send(res, status, headers, body) {
  const payload = typeof body === 'string' ? Buffer.from(body) : body;
  res.writeHead(status, { ...headers, 'content-length': payload.length });
  res.end(payload);
}

function problem(res, status, title, extra = {}) {
  send(res, status, { 'content-type': 'application/problem+json', ...extra },
       JSON.stringify({ type: 'about:blank', title, status }));
}

function forwardHeaders(headers, length) {
  const out = {};
  for (const [name, value] of Object.entries(headers)) {
    if (!HOP_BY_HOP.has(name)) out[name] = value;
  }
  if (length !== undefined) out['content-length'] = length;
  return out;
}

function startWorker(opts) {
  const agent = new http.Agent({ keepAlive: true, maxFreeSockets: 256 });
  const storage = new RedisStorageAdapter({ url: opts.redis });
  const idempotency = new Idempotency(storage, {
    idempotencyKey: 'idempotency-key',
    keyMaxLength: KEY_MAX_LENGTH,
    cacheTTLMS: RETENTION_MS,
    enforceIdempotency: true,
    inProgressStrategy: { wait: true, pollingIntervalMs: 100, maxWaitMs: WAIT_MS },
  });

  // The backend's answer, buffered (it is stored); rejects on a transport error.
  function callBackend(req, body) {
    return new Promise((resolve, reject) => {
      const up = http.request({
        host: '127.0.0.1', port: opts.backend, agent, method: req.method, path: req.url,
        headers: forwardHeaders(req.headers, body.length), timeout: 30000,
      }, (upRes) => {
        readBody(upRes, MAX_RESPONSE_BODY)
          .then((data) => resolve({ status: upRes.statusCode, headers: upRes.headers, body: data }))
          .catch(reject);
      });
      up.on('timeout', () => up.destroy(new Error('backend timeout')));
      up.on('error', reject);
      up.end(body);
    });
  }

  async function protectedRequest(req, res) {
    const tenant = req.headers['x-tenant-id'];
    if (!tenant) return problem(res, 400, 'missing X-Tenant-Id');
    let raw;
    try {
      raw = await readBody(req, MAX_REQUEST_BODY);
    } catch (err) {
      return problem(res, err.status || 400, 'unreadable body');
    }
    let parsed;
    try {
      parsed = JSON.parse(raw.toString('utf8'));
    } catch {
      return problem(res, 400, 'body is not JSON');
    }
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
      return problem(res, 400, 'body is not a JSON object');
    }
    // Tenant scoping: the library keys records by prefix:method:path:key, so the tenant
    // goes into the prefix (a per-request option the library has for this).
    const call = {
      method: req.method,
      path: ROUTE.path,
      headers: req.headers,
      body: fingerprintFields(parsed),
      options: { cacheKeyPrefix: `node-idempotency:${encodeURIComponent(tenant)}` },
    };
    let recorded;
    try {
      recorded = await idempotency.onRequest(call);
    } catch (err) {
      if (err instanceof IdempotencyError) {
        switch (err.code) {
          case IdempotencyErrorCodes.REQUEST_IN_PROGRESS:
            return problem(res, 409, 'request in progress', { 'retry-after': '1' });
          case IdempotencyErrorCodes.IDEMPOTENCY_FINGERPRINT_MISSMATCH:
            return problem(res, 422, 'Idempotency-Key reused with a different request');
          default:  // missing or too long (the library reports both as ..._LEN_EXEEDED)
            return problem(res, 400, 'missing or invalid Idempotency-Key');
        }
      }
      return problem(res, 503, 'idempotency store unavailable');
    }
    if (recorded) {
      const { status, headers } = recorded.additional;
      return send(res, status, { ...headers, 'idempotent-replayed': 'true' }, recorded.body);
    }
    let answer;
    try {
      answer = await callBackend(req, raw);
    } catch {
      // The library has no way to release a claim: the key stays in progress until its
      // TTL (the sidecar releases it, so that a retry runs again).
      return problem(res, 502, 'backend unavailable');
    }
    if (storable(answer.status)) {
      const headers = {};
      for (const name of REPLAY_HEADERS) {
        if (answer.headers[name] !== undefined) headers[name] = answer.headers[name];
      }
      try {
        await idempotency.onResponse(call, {
          body: answer.body.toString('utf8'),
          additional: { status: answer.status, headers },
        });
      } catch {
        return problem(res, 503, 'idempotency store unavailable');
      }
    }
    send(res, answer.status, forwardHeaders(answer.headers), answer.body);
  }

  // Unmatched routes: proxied to the backend unchanged, buffered like the protected route
  // (streaming with pipe() cost more per request for these small bodies).
  async function passThrough(req, res) {
    let raw;
    try {
      raw = await readBody(req, MAX_REQUEST_BODY);
    } catch (err) {
      return problem(res, err.status || 400, 'unreadable body');
    }
    let answer;
    try {
      answer = await callBackend(req, raw);
    } catch {
      return problem(res, 502, 'backend unavailable');
    }
    send(res, answer.status, forwardHeaders(answer.headers), answer.body);
  }

  const server = http.createServer({ requestTimeout: 30000, headersTimeout: 10000 }, (req, res) => {
    const path = req.url.split('?', 1)[0];
    if (req.method === ROUTE.method && path === ROUTE.path) {
      protectedRequest(req, res).catch(() => { if (!res.headersSent) problem(res, 500, 'internal error'); });
    } else {
      passThrough(req, res).catch(() => { if (!res.headersSent) problem(res, 500, 'internal error'); });
    }
  });
  server.keepAliveTimeout = 75000;
  storage.connect().then(() => {
    server.listen(opts.listen, '127.0.0.1', () => process.send && process.send('ready'));
  }, (err) => {
    console.error(`worker ${process.pid}: cannot connect to Redis: ${err.message}`);
    process.exit(1);
  });
}

function startPrimary(opts) {
  let stopping = false;
  let ready = 0;
  for (let i = 0; i < opts.workers; i++) {
    cluster.fork().on('message', (msg) => {
      if (msg === 'ready' && ++ready === opts.workers) {
        console.error(`node-idempotency bench server: ${opts.workers} workers on 127.0.0.1:${opts.listen}`);
      }
    });
  }
  // A worker that dies takes the peer down: a benchmark must not go on with fewer.
  cluster.on('exit', (worker, code, signal) => {
    if (stopping) return;
    console.error(`worker ${worker.process.pid} exited (${signal || code})`);
    stopping = true;
    for (const w of Object.values(cluster.workers)) w.kill();
    process.exitCode = 1;
  });
  const stop = () => {
    stopping = true;
    for (const w of Object.values(cluster.workers)) w.kill();
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

const opts = parseArgs(process.argv.slice(2));
if (cluster.isPrimary) startPrimary(opts);
else startWorker(opts);
