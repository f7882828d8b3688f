# idemproxy container image.
#
# Two stages from the same Debian 12 base, so that the runtime stage gets exactly the shared
# library versions the build stage linked against:
#   build    compilers and -dev packages; builds a stripped Release binary.
#   runtime  bookworm-slim plus only the shared libraries that binary needs, run as a
#            non-root user.
#
#   docker build -t idemproxy:dev .
#   buildah bud --format docker -t idemproxy:dev .   (see scripts/image-check, docs/container.md)
#
# Deliberately no `# syntax=` line and no BuildKit-only features (cache mounts, heredocs): the
# same file has to build offline with buildah, where a syntax line would mean fetching a frontend.

ARG DEBIAN_IMAGE=debian:bookworm-slim

# ---------------------------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build

# --no-install-recommends keeps the toolchain to what CMake actually uses. doctest-dev is not
# here: the image is configured with IDEM_BUILD_TESTS=OFF, and the tests run in scripts/test,
# not in the image build.
RUN set -eux; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        build-essential \
        cmake \
        pkg-config \
        libboost1.81-dev \
        libboost-json1.81-dev \
        libpq-dev \
        libssl-dev \
        libyaml-cpp-dev \
        libspdlog-dev \
        libjemalloc-dev; \
    rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Only what the sidecar's build reads (see .dockerignore, which also keeps build*/ and .git
# out of the context). Sources are copied after the package layer so that an edit to the code
# does not re-download the toolchain. The migrations are embedded into the binary at build
# time, so the runtime stage never needs migrations/.
COPY CMakeLists.txt ./
COPY cmake/ cmake/
COPY migrations/ migrations/
COPY proxy/ proxy/

# The final `--version` fails the build here, with the compiler still around to debug, rather
# than shipping a binary that cannot even start.
RUN set -eux; \
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DIDEM_BUILD_TESTS=OFF; \
    cmake --build build --target idemproxy -j"$(nproc)"; \
    strip --strip-unneeded build/idemproxy; \
    build/idemproxy --version

# ---------------------------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS runtime

# Label values only; the binary's own version comes from CMakeLists.txt. scripts/image-check
# passes the project version, the git commit and the remote (defaults here rather than a copy
# of the version number that would go stale).
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=""
# The file under config/ that becomes the image's default configuration.
ARG CONFIG=config/example.yaml

LABEL org.opencontainers.image.title="idemproxy" \
      org.opencontainers.image.description="Reverse-proxy idempotency sidecar: claims Idempotency-Key in PostgreSQL before forwarding and replays the first result" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"

# The runtime libraries are the ones `ldd` reports for the binary, mapped to their packages
# with `dpkg -S` (libc6, libstdc++6 and libgcc-s1 are already in the base). Asio and Beast are
# header-only and compiled into the binary. ca-certificates lets a database URL use
# sslrootcert=/etc/ssl/certs/ca-certificates.crt for a server with a public certificate.
RUN set -eux; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get update; \
    apt-get install -y --no-install-recommends \
        libboost-json1.81.0 \
        libpq5 \
        libssl3 \
        libyaml-cpp0.7 \
        libspdlog1.10 \
        libfmt9 \
        libjemalloc2 \
        ca-certificates; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log

# A fixed numeric uid/gid (not one picked by useradd) so that file ownership on mounted
# volumes and Kubernetes' runAsNonRoot/runAsUser checks are predictable across rebuilds; well
# above the 1000+ range that hosts give their first login users. --no-log-init: with a large
# uid, useradd would otherwise write a sparse lastlog/faillog entry that bloats the layer.
# No home directory and no login shell: the process writes nothing to disk (logs go to
# stderr), so the root filesystem can be mounted read-only.
RUN set -eux; \
    groupadd --gid 10001 idemproxy; \
    useradd --uid 10001 --gid idemproxy --no-log-init --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin idemproxy

COPY --from=build /src/build/idemproxy /usr/local/bin/idemproxy

# Guard against a library added to the build without its runtime package here: the image
# build fails instead of the container failing at start.
RUN set -eu; \
    if ldd /usr/local/bin/idemproxy | grep 'not found'; then \
        echo "runtime stage is missing shared libraries (listed above)" >&2; exit 1; \
    fi; \
    /usr/local/bin/idemproxy --version

# Config files belong to root and are readable, not writable, by the sidecar: a compromised
# process cannot rewrite its own routes. Mount a directory (or a single file) over
# /etc/idemproxy to replace the default; it only needs to be readable by uid 10001.
COPY ${CONFIG} /etc/idemproxy/idemproxy.yaml
RUN chmod 0755 /etc/idemproxy && chmod 0644 /etc/idemproxy/idemproxy.yaml
VOLUME ["/etc/idemproxy"]

# 8080: the proxied API (listen); 9901: the admin listener (/healthz, /readyz, /metrics).
EXPOSE 8080 9901

# Numeric, so runtimes that enforce runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001

# Liveness through the admin listener with nothing but bash (the slim image has no curl or
# wget, and adding one only for this would grow the image and its attack surface): open a
# TCP connection with /dev/tcp, send a GET /healthz, accept only a 200 status line. `timeout`
# (coreutils) bounds a connect or read that hangs even where the runtime ignores --timeout.
# Needs admin.listen enabled on port 9901, as in the default configuration.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["timeout", "4", "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9901 && printf 'GET /healthz HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n\\r\\n' >&3 && IFS= read -r status <&3 && [[ \"$status\" == *' 200 '* ]]"]

# SIGTERM (the default stop signal) drains in-flight requests and exits 0; keep the runtime's
# stop timeout above upstream.response_timeout so a drain is not cut short by SIGKILL.
ENTRYPOINT ["idemproxy"]
CMD ["serve", "--config", "/etc/idemproxy/idemproxy.yaml"]
