#include "support/process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>

#include "support/env.hpp"

extern char** environ;

namespace idem::it {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------- TempDir

TempDir::TempDir(std::string_view prefix) {
  const fs::path root = test_tmp_root();
  fs::create_directories(root);
  std::string pattern = (root / (std::string(prefix) + "-XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw Failure("cannot create a temporary directory under " + root.string() + ": " +
                  std::strerror(errno));
  }
  path_ = pattern;
}

TempDir::~TempDir() {
  if (path_.empty() || env("IDEM_TEST_KEEP_TMP")) {
    return;
  }
  std::error_code ignored;  // never throw from a destructor; scripts/test removes the root
  fs::remove_all(path_, ignored);
}

TempDir::TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    TempDir doomed(std::move(*this));
    path_ = std::exchange(other.path_, {});
  }
  return *this;
}

fs::path TempDir::write_file(std::string_view name, std::string_view content) const {
  const fs::path file = path_ / name;
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(content.data(), static_cast<std::streamsize>(content.size()));
  out.close();
  if (!out) {
    throw Failure("cannot write " + file.string());
  }
  return file;
}

// ------------------------------------------------------------------------- ExitStatus

bool ExitStatus::exited() const { return WIFEXITED(raw); }
int ExitStatus::code() const { return exited() ? WEXITSTATUS(raw) : -1; }
bool ExitStatus::signaled() const { return WIFSIGNALED(raw); }
int ExitStatus::signal() const { return signaled() ? WTERMSIG(raw) : 0; }

std::string ExitStatus::describe() const {
  if (exited()) {
    return "exit " + std::to_string(code());
  }
  if (signaled()) {
    const char* name = ::strsignal(signal());
    return "signal " + std::to_string(signal()) + " (" + (name ? name : "?") + ")";
  }
  return "wait status " + std::to_string(raw);
}

// ---------------------------------------------------------------------------- Process

namespace {

// RAII for the posix_spawn attribute objects, so every throw path releases them.
struct SpawnSetup {
  posix_spawn_file_actions_t actions{};
  posix_spawnattr_t attr{};
  SpawnSetup() {
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    ::posix_spawnattr_destroy(&attr);
    ::posix_spawn_file_actions_destroy(&actions);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

std::vector<std::string> child_environment(const ProcessOptions& options) {
  std::set<std::string, std::less<>> replaced(options.unset.begin(), options.unset.end());
  for (const auto& [name, value] : options.env) {
    replaced.insert(name);
  }
  std::vector<std::string> out;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view kv = *entry;
    if (!replaced.contains(kv.substr(0, kv.find('=')))) {
      out.emplace_back(kv);
    }
  }
  for (const auto& [name, value] : options.env) {
    out.push_back(name + "=" + value);
  }
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) {
    out.push_back(s.data());
  }
  out.push_back(nullptr);
  return out;
}

// Process groups of the children still alive, so a crash of the test binary can take
// them along. Every child leads its own group (so kill() reaches helpers it started, such
// as the commands of a shell script); the price is that a terminal's Ctrl-C reaches only
// the test binary, which is why SIGINT is in the list below.
//
// Signal-safe by construction: a fixed array of lock-free atomics, and kill(2).
constexpr std::size_t kMaxChildren = 512;
std::atomic<pid_t> g_children[kMaxChildren];
constexpr int kFatalSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT,
                                 SIGSEGV, SIGBUS, SIGFPE, SIGILL};
struct sigaction g_previous[std::size(kFatalSignals)];

void kill_children_and_chain(int sig) {
  for (auto& slot : g_children) {
    if (const pid_t pgid = slot.load(std::memory_order_relaxed); pgid > 0) {
      ::kill(-pgid, SIGKILL);
    }
  }
  // Hand the signal to whoever had it before (doctest reports the crash, then dies), or to
  // the default action: restore it, and the re-raised signal is delivered when we return.
  for (std::size_t i = 0; i < std::size(kFatalSignals); ++i) {
    if (kFatalSignals[i] == sig) {
      ::sigaction(sig, &g_previous[i], nullptr);
    }
  }
  ::raise(sig);
}

void install_crash_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (std::size_t i = 0; i < std::size(kFatalSignals); ++i) {
      struct sigaction action {};
      action.sa_handler = kill_children_and_chain;
      ::sigemptyset(&action.sa_mask);
      action.sa_flags = SA_RESETHAND;
      ::sigaction(kFatalSignals[i], &action, &g_previous[i]);
      // A signal the test binary was told to ignore (SIGINT in a background job) stays
      // ignored: handling it would turn a harmless signal into a dead test run.
      if (g_previous[i].sa_handler == SIG_IGN && !(g_previous[i].sa_flags & SA_SIGINFO)) {
        ::sigaction(kFatalSignals[i], &g_previous[i], nullptr);
      }
    }
  });
}

void register_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) {
      return;
    }
  }
  // Full: the child is still killed by its Process; only crash cleanup misses it.
}

void unregister_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) {
      return;
    }
  }
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return std::move(out).str();
}

}  // namespace

Process::Process(std::string executable, std::vector<std::string> args, EnvList env)
    : Process(ProcessOptions{.executable = std::move(executable),
                             .args = std::move(args),
                             .env = std::move(env)}) {}

Process::Process(ProcessOptions options) {
  if (options.executable.empty()) {
    throw Failure("Process: no executable given");
  }
  name_ = options.name.empty() ? fs::path(options.executable).filename().string() : options.name;
  dir_.emplace("idem-" + name_);
  log_path_ = dir_->path() / (name_ + ".log");

  std::vector<std::string> argv_strings{options.executable};
  argv_strings.insert(argv_strings.end(), options.args.begin(), options.args.end());
  std::vector<std::string> env_strings = child_environment(options);
  auto argv = c_strings(argv_strings);
  auto envp = c_strings(env_strings);

  SpawnSetup setup;
  ::posix_spawn_file_actions_addopen(&setup.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  const std::string log = log_path_.string();
  ::posix_spawn_file_actions_addopen(&setup.actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
  ::posix_spawn_file_actions_adddup2(&setup.actions, STDOUT_FILENO, STDERR_FILENO);
  // Without this the child inherits every socket the test holds: a connection the test
  // "closes" would stay open in the sidecar's copy, and client-gone tests would lie.
  ::posix_spawn_file_actions_addclosefrom_np(&setup.actions, STDERR_FILENO + 1);

  // The test binary may block or ignore signals (SIGPIPE especially); the child must start
  // with the defaults so SIGTERM/SIGHUP tests see the program's own handling.
  sigset_t all;
  sigset_t none;
  ::sigfillset(&all);
  ::sigemptyset(&none);
  ::posix_spawnattr_setsigdefault(&setup.attr, &all);
  ::posix_spawnattr_setsigmask(&setup.attr, &none);
  ::posix_spawnattr_setpgroup(&setup.attr, 0);
  ::posix_spawnattr_setflags(&setup.attr,
                             POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP);

  const bool search_path = options.executable.find('/') == std::string::npos;
  pid_t pid = -1;
  const int rc = search_path ? ::posix_spawnp(&pid, options.executable.c_str(), &setup.actions,
                                              &setup.attr, argv.data(), envp.data())
                             : ::posix_spawn(&pid, options.executable.c_str(), &setup.actions,
                                             &setup.attr, argv.data(), envp.data());
  if (rc != 0) {
    throw Failure("cannot start " + options.executable + ": " + std::strerror(rc));
  }
  pid_ = pid;
  install_crash_cleanup();
  register_child(pid_);
}

Process::~Process() {
  if (pid_ > 0 && !status_) {
    kill();
  }
}

Process::Process(Process&& other) noexcept
    : dir_(std::move(other.dir_)),
      log_path_(std::move(other.log_path_)),
      name_(std::move(other.name_)),
      pid_(std::exchange(other.pid_, -1)),
      status_(other.status_) {}

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !status_) {
      kill();
    }
    dir_ = std::move(other.dir_);
    log_path_ = std::move(other.log_path_);
    name_ = std::move(other.name_);
    pid_ = std::exchange(other.pid_, -1);
    status_ = other.status_;
  }
  return *this;
}

void Process::signal(int sig) {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, sig);
  }
}

std::optional<ExitStatus> Process::wait_exit(Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto interval = 1ms;
  while (running()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(interval,
                                                                              deadline - now));
    interval = std::min<Millis>(interval * 2, 10ms);
  }
  return status_;
}

bool Process::running() {
  if (pid_ <= 0 || status_) {
    return false;
  }
  int raw = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &raw, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    status_ = ExitStatus{raw};
    unregister_child(pid_);
    return false;
  }
  if (r < 0) {
    // ECHILD: someone else reaped it (a SIGCHLD handler set to SIG_IGN would do that).
    throw Failure("waitpid(" + name_ + "): " + std::strerror(errno));
  }
  return true;
}

ExitStatus Process::kill() {
  if (pid_ > 0 && !status_) {
    // The whole group: a wrapper script's own children must not outlive the test.
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    reap_blocking();
  }
  return status_.value_or(ExitStatus{});
}

void Process::reap_blocking() {
  int raw = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &raw, 0);
  } while (r < 0 && errno == EINTR);
  // On ECHILD there is nothing left to reap; record a SIGKILL-like status rather than
  // leave the object claiming the child still runs.
  status_ = ExitStatus{r == pid_ ? raw : SIGKILL};
  unregister_child(pid_);
}

std::string Process::log() const { return read_file(log_path_); }

std::string Process::log_tail(std::size_t lines) const {
  const std::string text = log();
  std::size_t pos = text.size();
  // A trailing newline ends the last line; it does not start an empty one.
  if (pos > 0 && text[pos - 1] == '\n') {
    --pos;
  }
  std::size_t seen = 0;
  while (pos > 0) {
    const auto nl = text.rfind('\n', pos - 1);
    if (nl == std::string::npos) {
      pos = 0;
      break;
    }
    if (++seen == lines) {
      pos = nl + 1;
      break;
    }
    pos = nl;
  }
  return text.substr(pos);
}

std::string Process::wait_for_output(std::string_view needle, Millis timeout) {
  std::string found;
  const auto scan = [&] {
    const std::string text = log();
    const auto at = text.find(needle);
    if (at == std::string::npos) {
      return false;
    }
    const auto begin = text.rfind('\n', at);
    const auto end = text.find('\n', at);
    if (end == std::string::npos) {
      return false;  // the line is still being written
    }
    found = text.substr(begin == std::string::npos ? 0 : begin + 1,
                        end - (begin == std::string::npos ? 0 : begin + 1));
    return true;
  };
  bool ended = false;
  try {
    wait_until(
        [&] {
          if (scan()) {
            return true;
          }
          // Check the log once more after seeing the exit: the line may have been written
          // just before the child ended.
          if (!running() && !scan()) {
            ended = true;
            throw Failure(name_ + " ended (" + status_->describe() + ") before printing \"" +
                          std::string(needle) + "\"; its log ends with:\n" + log_tail());
          }
          return false;
        },
        timeout, name_ + " to print \"" + std::string(needle) + "\"");
  } catch (const Failure& e) {
    if (ended) {
      throw;
    }
    throw Failure(std::string(e.what()) + "; its log ends with:\n" + log_tail());
  }
  return found;
}

CommandResult run_command(ProcessOptions options, Millis timeout) {
  const std::string what = options.executable;
  Process process(std::move(options));
  auto status = process.wait_exit(timeout);
  if (!status) {
    process.kill();
    throw Failure(what + " did not finish within " + std::to_string(timeout.count()) +
                  " ms; its output:\n" + process.log_tail());
  }
  return CommandResult{*status, process.log()};
}

}  // namespace idem::it
