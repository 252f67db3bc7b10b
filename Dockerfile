# Every orderly binary in one small image: orderly (operators' CLI, `up`),
# orderly-submitter, -scheduler, -agent, -supervisor, -remote-sim.
# Build: docker build -t orderly .   Run one role: docker run orderly orderly-scheduler
# (Not built on the project's CI machines: there is no Docker engine there; see README.)

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so that editing the sources does not rebuild them.
COPY Cargo.toml Cargo.lock ./
# The workspace's build settings (how the bundled SQLite is compiled).
COPY .cargo .cargo
COPY crates crates
COPY migrations migrations
# With OpenTelemetry export built in (off unless ORDERLY_OTEL_ENDPOINT is set).
# Each role's binary is built by its own crate; the operators' CLI by orderly-cli.
RUN cargo build --release --locked --bins --features orderly-runtime/otel \
      -p orderly-cli -p orderly-submitter -p orderly-scheduler -p orderly-agent \
      -p orderly-supervisor -p orderly-remote-sim \
 && mkdir /out \
 && cp target/release/orderly target/release/orderly-submitter target/release/orderly-scheduler \
       target/release/orderly-agent target/release/orderly-supervisor target/release/orderly-remote-sim /out/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin orderly
COPY --from=build /out/ /usr/local/bin/
USER 10001:10001
# JSON logs and the operations endpoints (/healthz, /readyz, /metrics) by default.
ENV ORDERLY_LOG_JSON=true \
    ORDERLY_HTTP_LISTEN=0.0.0.0:9090
EXPOSE 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s \
  CMD curl -fsS http://127.0.0.1:9090/healthz || exit 1
CMD ["orderly", "--help"]
