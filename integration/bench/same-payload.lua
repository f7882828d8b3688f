-- wrk script for integration/bench/same-payload: new keys on POST /orders, every request a
-- fresh Idempotency-Key, with one of two payload mixes (BENCH_PAYLOAD):
--
--   distinct  every request its own order (the amount, a fingerprinted field, counts up):
--             what same_payload_new_key costs when clients behave
--   same      every request the same order under a new key: the client bug the feature is
--             for, at its worst (every request a detection, all on one note row)
--
-- Both bodies have the same length. Distinct orders stay distinct across invocations
-- (BENCH_SEQ, a different number for each, up to 400): a warm-up's orders are not the
-- measured run's. done() writes one line of key=value results to
-- $BENCH_RESULT, as integration/bench/requests.lua does.
local payload = os.getenv("BENCH_PAYLOAD") or "distinct"
local nonce = os.getenv("BENCH_NONCE") or tostring(os.time())
local tenant = os.getenv("BENCH_TENANT") or "bench"
local seq = tonumber(os.getenv("BENCH_SEQ") or "0")
local result_file = os.getenv("BENCH_RESULT")

local next_thread = 0
function setup(thread)
  next_thread = next_thread + 1
  thread:set("thread_id", next_thread)
end

local headers = { ["Content-Type"] = "application/json", ["X-Tenant-Id"] = tenant }
local n = 0
function request()
  n = n + 1
  headers["Idempotency-Key"] = nonce .. "-" .. (thread_id or 0) .. "-" .. n
  -- Ten digits either way: 10^9 + (2 seq + thread) 10^7 + n while n < 10^7.
  local amount = 1000000000
  if payload == "distinct" then amount = 1000000000 + (2 * seq + (thread_id or 1)) * 10000000 + n end
  local body = '{"customer_id":"c-42","currency":"EUR","amount":' .. amount ..
               ',"items":[{"sku":"A-1","qty":2}],"trace_id":"t-1"}'
  return wrk.format("POST", "/orders", headers, body)
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
