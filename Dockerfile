# botmesh in a container: a multi-stage build (the toolchain stays in the first stage), run as
# a non-root user, with a health check on the node's /healthz.
#
#   docker build -t botmesh .
#   docker run --rm botmesh keygen --secret            # a mesh secret, for BOTMESH_SECRET
#   docker run -v "$PWD/peers.toml:/etc/botmesh/peers.toml:ro" -e BOTMESH_SECRET=… \
#              -e BOTMESH_HEALTH_ADDR=127.0.0.1:8101 botmesh run --bot XiaoBa
#
# deploy/compose.yaml runs the three-bot demo with it (README.md, "Packaging").

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p botmesh \
 && cp target/release/botmesh /botmesh \
 && strip /botmesh

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/botmesh --create-home botmesh \
 && mkdir -p /etc/botmesh
COPY --from=build /botmesh /usr/local/bin/botmesh
USER botmesh:botmesh
WORKDIR /var/lib/botmesh
VOLUME ["/var/lib/botmesh"]
# The local API address to probe (the bot's `api` in peers.toml, as seen inside the container).
ENV BOTMESH_HEALTH_ADDR=127.0.0.1:8101 \
    BOTMESH_LOG=info
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD curl -fsS "http://${BOTMESH_HEALTH_ADDR}/healthz" >/dev/null || exit 1
ENTRYPOINT ["botmesh"]
CMD ["--help"]
