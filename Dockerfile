# Every orderly binary in one small image: orderly (the operators' CLI, `dashboard`),
# orderly-local (every role in one process: `orderly up`), orderly-submitter,
# -scheduler, -agent, -supervisor, -remote-sim.
#   docker build -t orderly --build-arg VERSION=$(git describe --always) \
#     --build-arg REVISION=$(git rev-parse HEAD) .
#   docker run orderly orderly-scheduler          # one role (configured by ORDERLY_*)
#   docker run -v orderly-data:/data -p 8088:8088 \
#     -e ORDERLY_DASHBOARD_LISTEN=0.0.0.0:8088 -e ORDERLY_DASHBOARD_TOKEN=... \
#     orderly orderly up                           # everything on SQLite, in /data
# TLS (rustls, the platform's roots plus ORDERLY_CA_FILE) is in every build; nothing
# to turn on. (Not built on the project's CI machines: there is no Docker engine there;
# crates/local/tests/e2e/deploy.rs checks what this file names and walks what the image runs.)

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Plain instructions only (no BuildKit cache mounts, no heredocs): `docker build`,
# `docker buildx build` and `az acr build` (which does not run BuildKit) build it alike;
# `--locked` pins every version to Cargo.lock.
COPY Cargo.toml Cargo.lock ./
# The workspace's build settings (how the bundled SQLite is compiled).
COPY .cargo .cargo
COPY crates crates
COPY migrations migrations
# The commit `--version` names (the build has no .git): docker build --build-arg
# REVISION=$(git rev-parse --short=12 HEAD).
ARG REVISION=unknown
ENV ORDERLY_REVISION=${REVISION}
# With OpenTelemetry export built in (off unless ORDERLY_OTEL_ENDPOINT is set).
# Each role's binary is built by its own crate; the operators' CLI by orderly-cli, the
# local runner by orderly-local.
RUN cargo build --release --locked --bins --features orderly-runtime/otel \
      -p orderly-cli -p orderly-local -p orderly-submitter -p orderly-scheduler \
      -p orderly-agent -p orderly-supervisor -p orderly-remote-sim \
 && mkdir /out \
 && cp target/release/orderly target/release/orderly-local target/release/orderly-submitter \
       target/release/orderly-scheduler \
       target/release/orderly-agent target/release/orderly-supervisor target/release/orderly-remote-sim /out/

FROM debian:bookworm-slim
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="orderly" \
      org.opencontainers.image.description="Scheduler-Agent-Supervisor order processing: the roles, the operators' CLI and dashboard" \
      org.opencontainers.image.source="https://github.com/orderly-rs/orderly" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# ca-certificates: the platform roots every TLS client trusts. libssl3: the Service Bus
# client (azservicebus 0.25) still links OpenSSL through its azure_core 0.25; orderly's
# own TLS is rustls (docs/containers.md). curl: the healthchecks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin orderly \
 && mkdir /data && chown 10001:10001 /data
COPY --from=build /out/ /usr/local/bin/
# The embedded default (sqlite://orderly.db) lives in the working directory: /data, a
# volume the non-root user owns.
WORKDIR /data
VOLUME /data
USER 10001:10001
# JSON logs and the operations endpoints (/healthz, /readyz, /metrics) by default.
ENV ORDERLY_LOG_JSON=true \
    ORDERLY_HTTP_LISTEN=0.0.0.0:9090
EXPOSE 9090
# Healthy when the started command answers /healthz where it serves it: a role on
# ORDERLY_PROBE_LISTEN when set (the probes' own connections) or ORDERLY_HTTP_LISTEN,
# `orderly up` and `orderly dashboard` on ORDERLY_DASHBOARD_LISTEN (127.0.0.1:8088
# unless set). Each container serves one of them.
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s \
  CMD for listen in "${ORDERLY_PROBE_LISTEN:-}" "${ORDERLY_HTTP_LISTEN:-}" "${ORDERLY_DASHBOARD_LISTEN:-127.0.0.1:8088}"; do [ -n "$listen" ] && curl -fsS -m 2 -o /dev/null "http://127.0.0.1:${listen##*:}/healthz" && exit 0; done; exit 1
CMD ["orderly", "--help"]
