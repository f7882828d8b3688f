'use strict';
// integration/bench/store-crash's two Node programs (benchmark code, not the product; no
// packages beyond Node's own):
//
//   node crash.js backend --listen PORT
//       The order API of the comparison: every POST /orders it receives is one executed
//       order, counted per Idempotency-Key and answered 201 with an order id of its own
//       (a re-execution answers a different id, so a replay that is not the first answer
//       shows). GET /stats: {"executions": n, "keys": k}; GET /counts: {key: executions}.
//
//   node crash.js client --port PORT --prefix P --keys N --conns C --deadline-ms D
//                        [--first FILE]
//       Sends N distinct keys (P-0 … P-N-1, tenant P) over C keep-alive connections, each key again
//       and again until it gets a final answer: anything but a transport error, a 5xx or
//       a 409 with Retry-After (in progress). A key with no final answer by D ms after the
//       start is "stuck". Without --first it prints each key's final answer (JSON lines);
//       with --first (that output of an earlier pass) it compares every answer with the
//       first one. The last line is a JSON summary.
const http = require('node:http');
const fs = require('node:fs');

function args(argv) {
  const o = {};
  for (let i = 0; i < argv.length; i += 2) o[argv[i].replace(/^--/, '')] = argv[i + 1];
  return o;
}

function backend(o) {
  const counts = new Map();
  let executions = 0;
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      if (req.method === 'POST' && req.url === '/orders') {
        const key = String(req.headers['idempotency-key'] || '');
        counts.set(key, (counts.get(key) || 0) + 1);
        executions += 1;
        const body = JSON.stringify({ id: `ord_${executions}`, status: 'created' });
        res.writeHead(201, { 'content-type': 'application/json', location: `/orders/ord_${executions}`,
                             'content-length': Buffer.byteLength(body) });
        return res.end(body);
      }
      let body;
      if (req.url === '/stats') body = JSON.stringify({ executions, keys: counts.size });
      else if (req.url === '/counts') body = JSON.stringify(Object.fromEntries(counts));
      else { res.writeHead(404, { 'content-length': 0 }); return res.end(); }
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  });
  server.keepAliveTimeout = 60000;
  server.listen(Number(o.listen), '127.0.0.1');
}

// An order every target accepts (the reference order API refuses unknown members).
const ORDER = JSON.stringify({ customer_id: 'c-42', currency: 'EUR', amount: 1000,
                               items: [{ sku: 'A-1', qty: 2 }] });

function post(agent, port, tenant, key) {
  return new Promise((resolve) => {
    const req = http.request({
      host: '127.0.0.1', port, agent, method: 'POST', path: '/orders', timeout: 10000,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(ORDER),
                 'x-tenant-id': tenant, 'idempotency-key': key },
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, retryAfter: res.headers['retry-after'] !== undefined,
                                    body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', () => resolve({ status: 0 }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => resolve({ status: 0 }));
    req.end(ORDER);
  });
}

const final = (a) => a.status !== 0 && a.status < 500 && !(a.status === 409 && a.retryAfter);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function client(o) {
  const port = Number(o.port), n = Number(o.keys), conns = Number(o.conns);
  const deadline = Date.now() + Number(o['deadline-ms']);
  const first = new Map();
  if (o.first) {
    for (const line of fs.readFileSync(o.first, 'utf8').split('\n')) {
      if (line.startsWith('{"key"')) { const r = JSON.parse(line); first.set(r.key, r); }
    }
  }
  const agent = new http.Agent({ keepAlive: true, maxSockets: conns });
  const sum = { keys: n, final: 0, stuck: 0, attempts: 0, errors: 0, in_progress: 0,
                same_as_first: 0, differs_from_first: 0, statuses: {} };
  const out = [];
  let next = 0;
  async function worker() {
    for (;;) {
      const i = next++;
      if (i >= n) return;
      const key = `${o.prefix}-${i}`;
      let a;
      for (;;) {
        a = await post(agent, port, o.prefix, key);
        sum.attempts += 1;
        if (final(a)) break;
        if (a.status === 409) sum.in_progress += 1; else sum.errors += 1;
        if (Date.now() > deadline) break;
        await sleep(100);
      }
      if (!final(a)) { sum.stuck += 1; continue; }
      sum.final += 1;
      sum.statuses[a.status] = (sum.statuses[a.status] || 0) + 1;
      if (o.first) {
        const f = first.get(key);
        if (f && f.status === a.status && f.body === a.body) sum.same_as_first += 1;
        else sum.differs_from_first += 1;
      } else {
        out.push(JSON.stringify({ key, status: a.status, body: a.body }));
      }
    }
  }
  await Promise.all(Array.from({ length: conns }, worker));
  agent.destroy();
  if (out.length) process.stdout.write(out.join('\n') + '\n');
  process.stdout.write(JSON.stringify({ summary: sum }) + '\n');
}

const [mode, ...rest] = process.argv.slice(2);
if (mode === 'backend') backend(args(rest));
else if (mode === 'client') client(args(rest));
else { process.stderr.write('usage: crash.js backend|client ...\n'); process.exit(2); }
