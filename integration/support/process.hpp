#pragma once
// Child processes for end-to-end tests: the sidecar, the test backend, helper commands.
// Each child writes stdout and stderr to one log file in its own temporary directory, so a
// failing test can show what the process said (log_tail) and a chatty child can never
// block on a full pipe. Children are always reaped: the destructor SIGKILLs a child that is
// still running, with its process group (each child leads its own). If the test binary
// dies from a signal (crash, failed assert, Ctrl-C), a handler kills the children first;
// only SIGKILL of the test binary leaves them behind, and scripts/test cleans those up.
#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/wait.hpp"

namespace idem::it {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// A directory under test_tmp_root() (env.hpp), removed with its contents on destruction
// unless IDEM_TEST_KEEP_TMP is set (to inspect logs after a failure).
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "idem-it");
  ~TempDir();
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Writes `content` to path()/name and returns the full path.
  std::filesystem::path write_file(std::string_view name, std::string_view content) const;

 private:
  std::filesystem::path path_;
};

// How a child ended, decoded from the waitpid() status.
struct ExitStatus {
  int raw = 0;

  bool exited() const;    // ended by exit()/return from main
  int code() const;       // exit code; -1 unless exited()
  bool signaled() const;  // ended by a signal
  int signal() const;     // that signal; 0 unless signaled()
  bool success() const { return exited() && code() == 0; }
  std::string describe() const;  // "exit 0", "signal 9 (Killed)"
};

struct ProcessOptions {
  std::string executable;  // a path, or a bare name looked up in PATH
  std::vector<std::string> args;
  EnvList env;                     // set (or override) in the child's environment
  std::vector<std::string> unset;  // removed from the child's environment
  std::string name;                // log file name stem; defaults to the executable's name
};

class Process {
 public:
  explicit Process(ProcessOptions options);
  Process(std::string executable, std::vector<std::string> args, EnvList env = {});
  ~Process();
  Process(Process&&) noexcept;
  Process& operator=(Process&&) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // Sends `sig` unless the child was already reaped (then does nothing).
  void signal(int sig);
  // Waits up to `timeout` for the child to end and reaps it; nullopt if still running.
  std::optional<ExitStatus> wait_exit(Millis timeout);
  // Reaps the child if it has ended; true while it runs.
  bool running();
  // Set once the child was reaped.
  std::optional<ExitStatus> exit_status() const { return status_; }
  // SIGKILL and reap; returns how it ended (already-ended children are just reaped).
  ExitStatus kill();

  const std::filesystem::path& log_path() const { return log_path_; }
  std::string log() const;
  // The last `lines` lines of the log, for failure messages.
  std::string log_tail(std::size_t lines = 40) const;
  // Waits until a log line contains `needle` and returns that line. Fails early, with the
  // log tail, if the child exits first.
  std::string wait_for_output(std::string_view needle, Millis timeout = kDefaultTimeout);

 private:
  void reap_blocking();

  std::optional<TempDir> dir_;
  std::filesystem::path log_path_;
  std::string name_;
  pid_t pid_ = -1;
  std::optional<ExitStatus> status_;
};

struct CommandResult {
  ExitStatus status;
  std::string output;  // stdout and stderr, interleaved as written
};

// Runs a command to completion. If it does not end within `timeout` it is killed and
// Failure is thrown, with its output.
CommandResult run_command(ProcessOptions options, Millis timeout = kDefaultTimeout);

}  // namespace idem::it
