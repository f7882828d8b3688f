# Sourced by scripts/test, scripts/fuzz and scripts/demo: the Debian 12 packages they need,
# and the one way they install what is missing.
#
#   source "$root/scripts/lib/packages.bash"
#   idem_ensure_packages scripts/test "$install" "${idem_build_packages[@]}" ...
#
# Packages are checked one by one with dpkg-query, so a machine that has everything is
# never touched (no apt-get update, no root needed).

# shellcheck disable=SC2034  # used by the scripts that source this file

# Compiler, build system and libraries of the build (tests included: doctest).
idem_build_packages=(
  build-essential cmake pkg-config
  libboost1.81-dev libboost-json1.81-dev
  libpq-dev libssl-dev libyaml-cpp-dev libspdlog-dev doctest-dev libjemalloc-dev
)
# scripts/fuzz: clang and its libFuzzer/sanitizer runtimes, llvm-profdata/llvm-cov for
# --coverage (Debian 12's LLVM 14; the fuzz build uses clang++-14 explicitly).
idem_fuzz_packages=(clang-14 libclang-rt-14-dev llvm-14)
# The throwaway server of the tests and the demo (scripts/lib/pg-up), and psql.
idem_postgres_packages=(postgresql-15 postgresql-client-15)
# The throwaway pg_auto_failover cluster of the failover run (scripts/lib/paf-up).
idem_failover_packages=(postgresql-15-auto-failover pg-auto-failover-cli)
# Clients the end-to-end tests drive the sidecar with besides their own (curl over TLS:
# integration/suites/security_tls_test.cpp).
idem_test_tool_packages=(curl)

# idem_ensure_packages CALLER INSTALL PACKAGE...
#   Installs the PACKAGEs that are missing with apt-get, as root or through sudo. With
#   INSTALL=0 it only reports them. Returns non-zero, with a message naming CALLER, when
#   something is missing and cannot be installed.
idem_ensure_packages() {
  local caller=$1 install=$2
  shift 2
  local -a missing=() apt
  local pkg status
  for pkg in "$@"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ $status == installed ]] || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    echo "all $# required packages are installed"
    return 0
  fi
  echo "missing: ${missing[*]}"
  if ((!install)); then
    echo "$caller: --no-install given; install them first" >&2
    return 1
  fi
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o Dpkg::Use-Pty=0)
  if ((EUID != 0)); then
    if ! command -v sudo >/dev/null; then
      echo "$caller: installing packages needs root (or sudo)" >&2
      return 1
    fi
    apt=(sudo "${apt[@]}")
  fi
  "${apt[@]}" update
  "${apt[@]}" install --no-install-recommends "${missing[@]}"
}
