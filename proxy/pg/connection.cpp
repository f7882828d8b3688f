#include "pg/connection.hpp"

#include <poll.h>

#include <algorithm>
#include <cstdlib>

#include <boost/asio/deferred.hpp>
#include <boost/container/small_vector.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <libpq-fe.h>

namespace idem::pg::detail {
namespace {

// libpq prints server NOTICEs to stderr by default, bypassing the structured logs; the
// statements we run raise none worth keeping.
void discard_notice(void*, const char*) {}

// Text parameters must be NUL-terminated for libpq, and string_views are not: they are
// copied here, all into one buffer (one allocation per statement, not one per value).
// Binary parameters (bytea) are passed in place with their length. Not movable once
// built: `values` points into `text`.
struct ParamBuffers {
  static constexpr std::size_t kInline = 12;  // more than any statement of the store has
  std::string text;
  boost::container::small_vector<const char*, kInline> values;
  boost::container::small_vector<int, kInline> lengths;
  boost::container::small_vector<int, kInline> formats;

  ParamBuffers() = default;
  ParamBuffers(const ParamBuffers&) = delete;
  ParamBuffers& operator=(const ParamBuffers&) = delete;

  error_code build(const std::vector<Param>* params) {
    if (!params) return {};
    std::size_t text_bytes = 0;
    for (const Param& p : *params) {
      if (p.null || p.binary) continue;
      // The text protocol ends values at NUL; a silent truncation would store
      // something other than what the caller passed.
      if (p.value.find('\0') != std::string_view::npos) {
        return make_error_code(errc::invalid_parameter);
      }
      text_bytes += p.value.size() + 1;
    }
    text.reserve(text_bytes);  // never reallocated below: the pointers stay valid
    for (const Param& p : *params) {
      if (p.null) {
        values.push_back(nullptr);
        lengths.push_back(0);
        formats.push_back(0);
      } else if (p.binary) {
        // A null pointer would mean SQL NULL: an empty payload needs a real address.
        values.push_back(p.value.empty() ? "" : p.value.data());
        lengths.push_back(static_cast<int>(p.value.size()));
        formats.push_back(1);
      } else {
        const std::size_t at = text.size();
        text.append(p.value);
        text.push_back('\0');
        values.push_back(text.data() + at);
        lengths.push_back(0);
        formats.push_back(0);
      }
    }
    return {};
  }
  int count() const { return static_cast<int>(values.size()); }
};

// libpq's getenv, behind the pure host planner's lookup (host_list.hpp).
const char* process_env(const char* name) { return std::getenv(name); }

}  // namespace

Connection::Connection(asio::any_io_executor executor)
    : socket_(executor), resolver_(executor), deadline_(executor) {}

Connection::~Connection() { close(); }

void Connection::close() noexcept {
  disarm_deadline();
  // libpq owns the socket: Asio must let go of it (deregistering it from epoll) before
  // PQfinish closes it, or Asio would later close a descriptor number that may already
  // belong to another file.
  if (socket_.is_open()) socket_.release();
  // A connect may be suspended in a name lookup: it must not go on to open a session on
  // a connection its owner already closed.
  resolver_.cancel();
  if (conn_) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
  broken_ = true;
  closed_ = true;
}

int Connection::backend_pid() const noexcept { return conn_ ? PQbackendPID(conn_) : 0; }

bool Connection::reusable() const noexcept {
  return conn_ && !broken_ && !in_call_ && PQstatus(conn_) == CONNECTION_OK &&
         PQtransactionStatus(conn_) == PQTRANS_IDLE &&
         PQpipelineStatus(conn_) == PQ_PIPELINE_OFF;
}

bool Connection::idle_healthy() const noexcept {
  if (!reusable()) return false;
  // An idle session receives nothing unless the server is ending it (shutdown,
  // pg_terminate_backend, idle_session_timeout): then a FATAL message and/or EOF is
  // waiting in the socket. Handing out such a connection would fail the next call for
  // nothing, so any pending input (or error/hang-up) retires it. The rare harmless
  // asynchronous message only costs a reconnect.
  pollfd pfd{};
  pfd.fd = PQsocket(conn_);
  pfd.events = POLLIN;
  const int n = ::poll(&pfd, 1, 0);
  return n == 0;
}

error_code Connection::consume_input() {
  if (!conn_ || broken_) {
    error_message_ = "connection is not usable";
    return make_error_code(errc::connection_lost);
  }
  // PQconsumeInput reports EOF as a failure; a FATAL message ahead of it (shutdown,
  // pg_terminate_backend) arrives outside any call and goes to the notice processor, so
  // the EOF is what tells the session is over.
  if (PQconsumeInput(conn_) != 1 || PQstatus(conn_) != CONNECTION_OK) {
    return lost("cannot read from the server");
  }
  return {};
}

std::vector<Notification> Connection::take_notifications() {
  std::vector<Notification> out;
  if (!conn_) return out;
  struct FreeNotify {
    void operator()(PGnotify* n) const noexcept { PQfreemem(n); }
  };
  // PQnotifies also parses input read earlier but not yet looked at.
  while (std::unique_ptr<PGnotify, FreeNotify> n{PQnotifies(conn_)}) {
    out.push_back(Notification{n->relname, n->extra ? n->extra : ""});
  }
  return out;
}

void Connection::arm_deadline(Millis d) {
  timed_out_ = false;
  const std::uint64_t generation = ++deadline_generation_;
  deadline_.expires_after(d);
  // The handler holds only a weak reference: a pending deadline must not keep a closed
  // connection alive, and it must act only on the call that armed it.
  deadline_.async_wait([weak = weak_from_this(), generation](const error_code& ec) {
    if (ec) return;  // disarmed
    auto self = weak.lock();
    if (!self || self->deadline_generation_ != generation) return;
    self->timed_out_ = true;
    // The call is suspended in a socket wait or a name lookup (the only places it can be
    // while this handler runs on the same thread): cancelling wakes it with
    // operation_aborted, and it then reports the timeout and leaves the connection to be
    // closed. Nothing ever blocks on the server, so there is no blocking PQcancel round
    // trip either.
    error_code ignored;
    self->socket_.cancel(ignored);
    self->resolver_.cancel();
  });
}

void Connection::disarm_deadline() noexcept {
  ++deadline_generation_;
  deadline_.cancel();
}

error_code Connection::lost(std::string_view fallback_message) {
  broken_ = true;
  const char* msg = conn_ ? PQerrorMessage(conn_) : nullptr;
  error_message_ = (msg && *msg) ? msg : std::string(fallback_message);
  return make_error_code(errc::connection_lost);
}

error_code Connection::attach_socket() {
  // Re-attached after every PQconnectPoll, not only when the number changes: libpq may
  // close the socket and open another (next host of a multi-host URI, SSL fallback),
  // and the new one can reuse the same descriptor number. epoll drops a closed file's
  // registration, so waiting through the old registration would never wake up.
  if (socket_.is_open()) socket_.release();
  const int fd = PQsocket(conn_);
  if (fd < 0) {
    error_message_ = PQerrorMessage(conn_);
    return make_error_code(errc::connection_failed);
  }
  error_code ec;
  socket_.assign(fd, ec);
  if (ec) {
    error_message_ = "cannot watch the PostgreSQL socket: " + ec.message();
    return make_error_code(errc::connection_failed);
  }
  return {};
}

error_code Connection::after_wait(const error_code& ec) {
  // Whatever interrupted the wait, the protocol state is unknown now: never reuse it.
  if (timed_out_) {
    broken_ = true;
    error_message_ = "client-side deadline passed";
    return make_error_code(errc::timeout);
  }
  if (ec == asio::error::operation_aborted) {
    broken_ = true;
    error_message_ = "call cancelled";
    return make_error_code(errc::cancelled);
  }
  if (ec) {
    broken_ = true;
    error_message_ = "socket wait failed: " + ec.message();
    return make_error_code(errc::connection_lost);
  }
  return {};
}

asio::awaitable<error_code> Connection::wait(Wait what) {
  if (timed_out_) co_return make_error_code(errc::timeout);
  // Asio waits with level semantics here: a wait that starts while the socket is already
  // ready completes at once (the reactor re-arms the descriptor with EPOLL_CTL_MOD), so a
  // readiness edge consumed earlier is never lost.
  error_code ec;
  if (what == Wait::read_or_write) {
    auto [order, read_ec, write_ec] =
        co_await asio::experimental::make_parallel_group(
            socket_.async_wait(asio::posix::stream_descriptor::wait_read, asio::deferred),
            socket_.async_wait(asio::posix::stream_descriptor::wait_write, asio::deferred))
            .async_wait(asio::experimental::wait_for_one(), asio::use_awaitable);
    ec = order[0] == 0 ? read_ec : write_ec;
  } else {
    const auto type = what == Wait::read ? asio::posix::stream_descriptor::wait_read
                                         : asio::posix::stream_descriptor::wait_write;
    co_await socket_.async_wait(type, asio::redirect_error(asio::use_awaitable, ec));
  }
  if (auto failed = after_wait(ec)) co_return failed;
  co_return error_code{};
}

asio::awaitable<error_code> Connection::poll_connect() {
  // libpq's contract: behave as if the first poll had answered "writing".
  PostgresPollingStatusType status = PGRES_POLLING_WRITING;
  for (;;) {
    if (auto ec = attach_socket()) co_return ec;
    const Wait what = status == PGRES_POLLING_READING ? Wait::read : Wait::write;
    if (auto ec = co_await wait(what)) co_return ec;
    status = PQconnectPoll(conn_);
    if (status == PGRES_POLLING_OK) co_return error_code{};
    if (status == PGRES_POLLING_FAILED) {
      error_message_ = PQerrorMessage(conn_);
      co_return make_error_code(errc::connection_failed);
    }
  }
}

asio::awaitable<error_code> Connection::resolve_targets(HostPlan& plan) {
  // libpq looks host names up with a blocking getaddrinfo() inside PQconnectStart and
  // PQconnectPoll: a slow DNS server would stall every request on this thread. Names are
  // resolved here instead (Asio's resolver runs getaddrinfo on its own thread) and passed
  // as hostaddr next to the unchanged host, which libpq still uses for TLS name checks and
  // .pgpass. Each address becomes a target of its own, in order, as libpq would have
  // tried them.
  if (plan.whole_list) co_return error_code{};
  const auto unresolved = [](const HostTarget& t) {
    return t.hostaddr.empty() && needs_lookup(t.host);
  };
  if (std::none_of(plan.targets.begin(), plan.targets.end(), unresolved)) co_return error_code{};

  std::vector<HostTarget> out;
  for (const HostTarget& t : plan.targets) {
    if (!unresolved(t)) {
      out.push_back(t);
      continue;
    }
    error_code ec;
    auto results = co_await resolver_.async_resolve(
        t.host, "", asio::redirect_error(asio::use_awaitable, ec));
    if (timed_out_) co_return make_error_code(errc::timeout);
    if (ec == asio::error::operation_aborted) co_return make_error_code(errc::cancelled);
    if (ec) {
      // Like libpq, a name that does not resolve only skips that host.
      if (plan.targets.size() > 1) continue;
      error_message_ =
          "could not translate host name \"" + t.host + "\" to address: " + ec.message();
      co_return make_error_code(errc::connection_failed);
    }
    std::vector<std::string> seen;
    for (const auto& entry : results) {
      std::string addr = entry.endpoint().address().to_string();
      if (std::find(seen.begin(), seen.end(), addr) != seen.end()) continue;
      seen.push_back(addr);
      out.push_back(HostTarget{t.host, std::move(addr), t.port});
    }
  }
  if (out.empty()) {
    error_message_ = "could not translate any host name to an address";
    co_return make_error_code(errc::connection_failed);
  }
  plan.targets = std::move(out);
  co_return error_code{};
}

asio::awaitable<error_code> Connection::connect(const PoolOptions& options) {
  error_message_.clear();
  in_call_ = true;
  error_code ec = co_await connect_any(options);
  disarm_deadline();
  in_call_ = false;
  if (ec) {
    broken_ = true;
    // A connection that breaks before it is ready is a failed connect, whatever step
    // noticed it.
    if (ec == errc::connection_lost) ec = make_error_code(errc::connection_failed);
  }
  co_return ec;
}

// One attempt per target (host_list.hpp), each within its own connect_timeout, which
// covers the TCP connect, authentication, libpq's target_session_attrs check and the
// session setup. libpq's own connect_timeout only applies to its blocking connect; with
// PQconnectPoll the caller enforces it, as libpq does: per host.
asio::awaitable<error_code> Connection::connect_any(const PoolOptions& options) {
  HostPlan plan = plan_hosts(options.conninfo, &process_env);
  if (!plan.error.empty()) {
    error_message_ = plan.error;
    co_return make_error_code(errc::connection_failed);
  }
  arm_deadline(options.connect_timeout);  // name lookups
  if (auto ec = co_await resolve_targets(plan)) co_return ec;

  const std::vector<std::string> passes =
      session_attrs_passes(plan.session_attrs, plan.targets.size());
  const std::size_t attempts = passes.size() * plan.targets.size();
  std::string messages;
  error_code last;
  bool all_timed_out = true;
  for (const std::string& attrs : passes) {
    for (const HostTarget& target : plan.targets) {
      if (closed_) co_return make_error_code(errc::cancelled);
      arm_deadline(options.connect_timeout);
      error_code ec = co_await attempt(plan, target, attrs, options);
      if (!ec) co_return ec;
      // The owner closed the connection: no other host is wanted either.
      if (ec == errc::cancelled || closed_) co_return make_error_code(errc::cancelled);
      if (attempts == 1) co_return ec;
      if (ec == errc::timeout) {
        error_message_ = "no answer from " + describe(target) + " within connect_timeout (" +
                         std::to_string(options.connect_timeout.count()) + " ms)";
      }
      if (!messages.empty()) messages += "; ";
      messages += error_message_;
      last = ec;
      all_timed_out = all_timed_out && ec == errc::timeout;
      end_attempt();
    }
  }
  error_message_ = std::move(messages);
  if (all_timed_out) co_return make_error_code(errc::timeout);
  co_return last == errc::timeout ? make_error_code(errc::connection_failed) : last;
}

std::string Connection::describe(const HostTarget& t) {
  std::string s = "server at \"" + (t.host.empty() ? std::string("(default)") : t.host) + "\"";
  if (!t.hostaddr.empty() && t.hostaddr != t.host) s += " (" + t.hostaddr + ")";
  if (!t.port.empty()) s += ", port " + t.port;
  return s;
}

void Connection::end_attempt() noexcept {
  if (socket_.is_open()) socket_.release();
  if (conn_) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
  broken_ = false;
  timed_out_ = false;
}

asio::awaitable<error_code> Connection::attempt(const HostPlan& plan, const HostTarget& target,
                                                const std::string& session_attrs,
                                                const PoolOptions& options) {
  ConnectParams params;
  for (const auto& [key, value] : plan.common) params.add(key, value);
  if (!target.host.empty()) params.add("host", target.host);
  if (!target.hostaddr.empty()) params.add("hostaddr", target.hostaddr);
  if (!target.port.empty()) params.add("port", target.port);
  if (!session_attrs.empty()) params.add("target_session_attrs", session_attrs);
  std::vector<const char*> keys, values;
  for (std::size_t i = 0; i < params.keys.size(); ++i) {
    keys.push_back(params.keys[i].c_str());
    values.push_back(params.values[i].c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  // expand_dbname = 0: the conninfo was parsed above; dbname is now a plain name.
  conn_ = PQconnectStartParams(keys.data(), values.data(), 0);
  if (!conn_) {
    error_message_ = "libpq could not allocate a connection";
    co_return make_error_code(errc::connection_failed);
  }
  PQsetNoticeProcessor(conn_, &discard_notice, nullptr);
  if (PQstatus(conn_) == CONNECTION_BAD) {
    error_message_ = PQerrorMessage(conn_);
    co_return make_error_code(errc::connection_failed);
  }
  if (auto ec = co_await poll_connect()) co_return ec;
  if (PQsetnonblocking(conn_, 1) != 0) {
    error_message_ = PQerrorMessage(conn_);
    co_return make_error_code(errc::connection_failed);
  }
  co_return co_await setup_session(options);
}

asio::awaitable<error_code> Connection::setup_session(const PoolOptions& options) {
  // One pipelined round trip for the session settings and every prepared statement,
  // instead of 1 + N: reconnect storms after a database restart stay short.
  //
  // lock_timeout = statement_timeout bounds lock waits on its own as well (the
  // statement's timer starts first and normally fires first; lock_timeout still holds if
  // a caller changes statement_timeout on the session); idle_in_transaction_session_timeout
  // guards against a transaction left open by a caller that vanished (we never hold one
  // across calls); bytea_output is pinned because decode_bytea_hex() reads only hex.
  static constexpr const char* kSetupSql =
      "SELECT set_config('statement_timeout', $1, false),"
      " set_config('lock_timeout', $1, false),"
      " set_config('idle_in_transaction_session_timeout', $2, false),"
      " set_config('application_name', $3, false),"
      " set_config('bytea_output', 'hex', false)";
  const std::string statement_ms = std::to_string(options.statement_timeout.count());
  const std::string idle_tx_ms =
      std::to_string((options.statement_timeout + options.deadline_margin).count());
  const char* const values[] = {statement_ms.c_str(), idle_tx_ms.c_str(),
                                options.application_name.c_str()};

  if (PQenterPipelineMode(conn_) != 1) co_return lost("cannot enter pipeline mode");
  if (PQsendQueryParams(conn_, kSetupSql, 3, nullptr, values, nullptr, nullptr, 0) != 1) {
    co_return lost("cannot send the session setup");
  }
  for (const SessionSetting& s : options.settings) {
    const char* const setting[] = {s.name.c_str(), s.value.c_str()};
    if (PQsendQueryParams(conn_, "SELECT set_config($1, $2, false)", 2, nullptr, setting, nullptr,
                          nullptr, 0) != 1) {
      co_return lost("cannot send a session setting");
    }
  }
  for (const PreparedStatement& s : options.statements) {
    if (PQsendPrepare(conn_, s.name.c_str(), s.sql.c_str(), 0, nullptr) != 1) {
      co_return lost("cannot send a prepared statement");
    }
  }
  if (PQpipelineSync(conn_) != 1) co_return lost("cannot sync the pipeline");
  if (auto ec = co_await flush()) co_return ec;

  // Each queued command yields its results and then a null; the first error aborts the
  // rest of the pipeline (PGRES_PIPELINE_ABORTED), and the sync point closes it.
  error_code first_error;
  const std::size_t commands = 1 + options.settings.size() + options.statements.size();
  for (std::size_t i = 0; i < commands; ++i) {
    for (;;) {
      auto next = co_await next_result();
      if (!next) co_return next.error();
      if (*next == nullptr) break;
      Result r(*next);
      const ExecStatusType st = PQresultStatus(r.native());
      if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) continue;
      if (!first_error) {
        first_error = st == PGRES_PIPELINE_ABORTED ? make_error_code(errc::protocol)
                                                   : error_from_result(r);
      }
    }
  }
  auto sync = co_await next_result();
  if (!sync) co_return sync.error();
  Result sync_result(*sync);
  if (PQresultStatus(sync_result.native()) != PGRES_PIPELINE_SYNC ||
      PQexitPipelineMode(conn_) != 1) {
    broken_ = true;
    if (!first_error) {
      error_message_ = "session setup pipeline did not end as expected";
      first_error = make_error_code(errc::protocol);
    }
  }
  co_return first_error;
}

// Nearly always the first PQflush empties libpq's buffer into the socket (callers try it
// inline, without a coroutine frame); an error or a full kernel buffer comes here.
asio::awaitable<error_code> Connection::finish_flush(int first_flush) {
  if (first_flush < 0) co_return lost("cannot send to the server");
  co_return co_await flush();
}

asio::awaitable<error_code> Connection::flush() {
  for (;;) {
    const int r = PQflush(conn_);
    if (r == 0) co_return error_code{};
    if (r < 0) co_return lost("cannot send to the server");
    // The kernel buffer is full. Per libpq, wait for either direction: the server may be
    // blocked writing to us (a NOTICE, an early error) and not read until we read.
    if (auto ec = co_await wait(Wait::read_or_write)) co_return ec;
    if (PQconsumeInput(conn_) != 1) co_return lost("cannot read from the server");
  }
}

asio::awaitable<error_code> Connection::receive() {
  // wait(Wait::read) and PQconsumeInput folded into one coroutine: the result loops below
  // take whole results synchronously and suspend only here, once per network read, which
  // keeps coroutine frames off the per-result path.
  if (timed_out_) co_return make_error_code(errc::timeout);
  error_code ec;
  co_await socket_.async_wait(asio::posix::stream_descriptor::wait_read,
                              asio::redirect_error(asio::use_awaitable, ec));
  if (auto failed = after_wait(ec)) co_return failed;
  if (PQconsumeInput(conn_) != 1) co_return lost("cannot read from the server");
  co_return error_code{};
}

asio::awaitable<result<::pg_result*>> Connection::next_result() {
  // PQgetResult would block while a result is incomplete: only call it when PQisBusy
  // says the buffered input holds a whole one (or the command is finished).
  //
  // With TLS this relies on the server's records fitting the 8 KiB libpq keeps free
  // (PostgreSQL's send buffer is 8 KiB); otherwise decrypted data could sit in OpenSSL
  // while the socket stays quiet. Vanilla PostgreSQL satisfies it.
  while (PQisBusy(conn_) != 0) {
    if (auto ec = co_await wait(Wait::read)) co_return ec;
    if (PQconsumeInput(conn_) != 1) co_return lost("cannot read from the server");
  }
  co_return PQgetResult(conn_);
}

error_code Connection::error_from_result(const Result& r) {
  const char* msg = PQresultErrorMessage(r.native());
  error_message_ = (msg && *msg) ? msg : "PostgreSQL reported an error";
  const char* state = PQresultErrorField(r.native(), PG_DIAG_SQLSTATE);
  if (state && *state) {
    error_code ec = make_sqlstate_error(state);
    // After a connection-class or shutdown error the session is gone or going: never
    // hand it out again, whatever PQstatus says at this instant.
    if (to_store_errc(ec) == idem::errc::store_unavailable) broken_ = true;
    return ec;
  }
  // libpq-generated errors carry no SQLSTATE: they describe the connection itself.
  if (PQstatus(conn_) != CONNECTION_OK) {
    broken_ = true;
    return make_error_code(errc::connection_lost);
  }
  return make_error_code(errc::protocol);
}

asio::awaitable<error_code> Connection::drain_command(Result& kept, error_code& first_error) {
  // One command yields its result (or an error, or, in a pipeline, PGRES_PIPELINE_ABORTED
  // once an earlier command failed) and then null. Draining to the null is what leaves the
  // connection ready for what follows. The first error is kept in first_error; the return
  // value is set only when the connection itself can no longer be used.
  for (;;) {
    while (PQisBusy(conn_) != 0) {
      if (auto ec = co_await receive()) co_return ec;
    }
    ::pg_result* next = PQgetResult(conn_);
    if (next == nullptr) co_return error_code{};
    Result r(next);
    switch (PQresultStatus(r.native())) {
      case PGRES_TUPLES_OK:
      case PGRES_COMMAND_OK:
        if (!first_error && !kept) kept = std::move(r);
        break;
      case PGRES_PIPELINE_ABORTED:
        if (!first_error) first_error = make_error_code(errc::protocol);
        break;
      case PGRES_FATAL_ERROR:
      case PGRES_BAD_RESPONSE:
        if (!first_error) first_error = error_from_result(r);
        break;
      default:
        // COPY modes, empty queries, single-row mode: nothing this client issues. COPY in
        // particular would keep returning results forever; drop the connection instead.
        broken_ = true;
        error_message_ = "unexpected result status ";
        error_message_ += PQresStatus(PQresultStatus(r.native()));
        co_return make_error_code(errc::protocol);
    }
  }
}

asio::awaitable<result<Result>> Connection::collect_results() {
  Result kept;
  error_code first_error;
  if (auto ec = co_await drain_command(kept, first_error)) co_return ec;
  if (first_error) co_return first_error;
  if (!kept) {
    error_message_ = "the server returned no result";
    co_return make_error_code(errc::protocol);
  }
  co_return std::move(kept);
}

asio::awaitable<result<Result>> Connection::run(const Command& command, Millis deadline) {
  error_message_.clear();
  if (!reusable()) {
    error_message_ = "connection is not usable";
    co_return make_error_code(errc::connection_lost);
  }
  ParamBuffers params;
  if (auto ec = params.build(command.params)) {
    error_message_ = "text parameter contains a NUL byte";
    co_return ec;
  }

  in_call_ = true;
  arm_deadline(deadline);
  const int sent =
      command.kind == Command::Kind::prepared
          ? PQsendQueryPrepared(conn_, std::string(command.text).c_str(), params.count(),
                                params.values.data(), params.lengths.data(),
                                params.formats.data(), 0)
          : PQsendQueryParams(conn_, std::string(command.text).c_str(), params.count(),
                              nullptr, params.values.data(), params.lengths.data(),
                              params.formats.data(), 0);
  result<Result> out = make_error_code(errc::protocol);
  if (sent != 1) {
    out = lost("cannot send the statement");
  } else {
    const int flushed = PQflush(conn_);
    error_code ec;
    if (flushed != 0) ec = co_await finish_flush(flushed);
    if (ec) {
      out = ec;
    } else {
      out = co_await collect_results();
    }
  }
  disarm_deadline();
  in_call_ = false;
  co_return out;
}

asio::awaitable<result<std::vector<Result>>> Connection::collect_pipeline(std::size_t commands) {
  // Every command's results, then the sync point's result closes the pipeline.
  std::vector<Result> kept(commands);
  error_code first_error;
  for (std::size_t i = 0; i < commands; ++i) {
    if (auto ec = co_await drain_command(kept[i], first_error)) co_return ec;
  }
  // The sync point. Its own failure (the implicit transaction's commit) arrives as an
  // error result ahead of it, so everything up to PGRES_PIPELINE_SYNC is looked at.
  for (int guard = 0;; ++guard) {
    while (PQisBusy(conn_) != 0) {
      if (auto ec = co_await receive()) co_return ec;
    }
    ::pg_result* next = PQgetResult(conn_);
    if (next == nullptr) {
      if (guard < 4) continue;
      broken_ = true;
      error_message_ = "pipeline ended without its sync point";
      co_return make_error_code(errc::protocol);
    }
    Result r(next);
    const ExecStatusType st = PQresultStatus(r.native());
    if (st == PGRES_PIPELINE_SYNC) break;
    if ((st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE) && !first_error) {
      first_error = error_from_result(r);
    }
  }
  if (PQexitPipelineMode(conn_) != 1) {
    broken_ = true;
    error_message_ = "cannot leave pipeline mode";
    co_return make_error_code(errc::protocol);
  }
  if (first_error) co_return first_error;
  for (const Result& r : kept) {
    if (!r) {
      error_message_ = "the server returned no result";
      co_return make_error_code(errc::protocol);
    }
  }
  co_return std::move(kept);
}

asio::awaitable<result<std::vector<Result>>> Connection::run_pipeline(
    const std::vector<Command>& commands, Millis deadline) {
  error_message_.clear();
  if (!reusable()) {
    error_message_ = "connection is not usable";
    co_return make_error_code(errc::connection_lost);
  }
  std::vector<ParamBuffers> params(commands.size());
  for (std::size_t i = 0; i < commands.size(); ++i) {
    if (auto ec = params[i].build(commands[i].params)) {
      error_message_ = "text parameter contains a NUL byte";
      co_return ec;
    }
  }

  in_call_ = true;
  arm_deadline(deadline);
  result<std::vector<Result>> out = make_error_code(errc::protocol);
  bool sent = PQenterPipelineMode(conn_) == 1;
  for (std::size_t i = 0; sent && i < commands.size(); ++i) {
    const std::string name(commands[i].text);
    sent = PQsendQueryPrepared(conn_, name.c_str(), params[i].count(), params[i].values.data(),
                               params[i].lengths.data(), params[i].formats.data(), 0) == 1;
  }
  if (!sent || PQpipelineSync(conn_) != 1) {
    out = lost("cannot send the pipeline");
  } else {
    const int flushed = PQflush(conn_);
    error_code ec;
    if (flushed != 0) ec = co_await finish_flush(flushed);
    if (ec) {
      out = ec;
    } else {
      out = co_await collect_pipeline(commands.size());
    }
  }
  disarm_deadline();
  in_call_ = false;
  co_return out;
}

}  // namespace idem::pg::detail
