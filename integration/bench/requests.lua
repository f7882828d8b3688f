-- wrk script for scripts/bench: one file, three request mixes chosen by BENCH_MODE.
--
--   passthrough  POST /v1/carts (no route matches: proxied unchanged), the same request
--                every time; for the sidecar, nginx and the backend alike
--   new          POST /orders with a fresh Idempotency-Key per request (claim + forward +
--                completion in the sidecar). A key starts with 8 random hex digits, so
--                that new keys land all over the primary key's index, as clients' UUIDs
--                do (and as pgbench's random keys do), not at one spot of it; the
--                nonce, thread and counter after them keep every key unique
--   replay       POST /orders with a key drawn from 1..N (tenant bench-replay), all recorded
--                beforehand (the sidecar answers from PostgreSQL; nginx forwards)
--   orders       POST /orders with a fresh Idempotency-Key per request (as for new) and
--                an order the reference order API accepts: one real order (and outbox
--                event) each
--
-- Every request carries the tenant header and a JSON body: the same bytes for pass-through
-- and replays (a retry repeats its request), and for new keys and orders a body whose
-- customer differs per request, as different orders' bodies do; otherwise every new key
-- would find its fingerprint in the sidecar's fingerprint memo (docs/architecture.md),
-- which real first requests do not. done() writes one line of key=value results to
-- $BENCH_RESULT for scripts/bench to collect.
local mode = os.getenv("BENCH_MODE") or "passthrough"
local nonce = os.getenv("BENCH_NONCE") or tostring(os.time())
local replay_keys = tonumber(os.getenv("BENCH_REPLAY_KEYS") or "1000")
local tenant = os.getenv("BENCH_TENANT") or "bench"
local result_file = os.getenv("BENCH_RESULT")

local body = '{"customer_id":"c-42","currency":"EUR","amount":1000,' ..
             '"items":[{"sku":"A-1","qty":2}],"trace_id":"t-1"}'
if mode == "orders" then
  body = '{"customer_id":"c-42","currency":"EUR","amount":1000,"items":[{"sku":"A-1","qty":2}]}'
end

-- Each wrk thread has its own Lua state: setup() (main state) hands each a distinct id so
-- that keys never collide across threads.
local next_thread = 0
function setup(thread)
  next_thread = next_thread + 1
  thread:set("thread_id", next_thread)
end

if mode == "passthrough" then
  -- Static request: wrk serializes it once, so the client spends nothing per request.
  wrk.method = "POST"
  wrk.path = "/v1/carts"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["X-Tenant-Id"] = tenant
  wrk.headers["Idempotency-Key"] = "pass-" .. nonce
  wrk.body = body
else
  local headers = { ["Content-Type"] = "application/json", ["X-Tenant-Id"] = tenant }
  local n = 0
  function init(args)
    math.randomseed(os.time() + (thread_id or 0) * 7919)
  end
  if mode == "new" or mode == "orders" then
    local customer = '"customer_id":"c-42"'
    local at = body:find(customer, 1, true)
    assert(at, "the body names customer c-42")
    local head, tail = body:sub(1, at - 1), body:sub(at + #customer)
    function request()
      n = n + 1
      headers["Idempotency-Key"] = string.format("%08x-", math.random(0, 0x7fffffff) * 2 + math.random(0, 1)) ..
                                   nonce .. "-" .. (thread_id or 0) .. "-" .. n
      local order = head .. '"customer_id":"c-' .. nonce .. "-" .. (thread_id or 0) .. "-" .. n .. '"' .. tail
      return wrk.format("POST", "/orders", headers, order)
    end
  else
    function request()
      headers["Idempotency-Key"] = tostring(math.random(replay_keys))
      return wrk.format("POST", "/orders", headers, body)
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local secs = summary.duration / 1e6
  local line = string.format(
    "requests=%d seconds=%.3f rps=%.1f p50_us=%d p90_us=%d p99_us=%d mean_us=%.1f " ..
    "err_connect=%d err_read=%d err_write=%d err_status=%d err_timeout=%d\n",
    summary.requests, secs, summary.requests / secs,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean,
    e.connect, e.read, e.write, e.status, e.timeout)
  if result_file then
    local f = assert(io.open(result_file, "w"))
    f:write(line)
    f:close()
  end
end
