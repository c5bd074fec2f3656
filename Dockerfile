# palisade's image: every palisade binary and the CA certificates, on distroless (glibc and
# libgcc, no shell, no package manager), running as uid 65532. compose.yaml picks the command
# per service; the Helm chart (helm/palisade) runs the default target.
#
# The dependencies are built in a layer of their own (cargo-chef: a recipe of the manifests and
# Cargo.lock), so a change to palisade's code rebuilds palisade only.

FROM rust:1.95-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
# The packages of the seven binaries (not the tests crate and its dependencies).
ARG PACKAGES="-p palisade -p admission -p dispatch -p ingestion -p enrichment -p reaper -p reference-worker"
COPY --from=planner /src/recipe.json recipe.json
# The dependency-cache layer: changes only when the manifests or Cargo.lock do.
RUN cargo chef cook --release --locked --recipe-path recipe.json $PACKAGES
COPY . .
RUN cargo build --release --locked --bins $PACKAGES \
 && mkdir /out \
 && cp target/release/palisade target/release/palisade-admission \
       target/release/palisade-dispatch target/release/palisade-ingestion \
       target/release/palisade-enrichment target/release/palisade-reaper \
       target/release/palisade-worker /out/

# compose.yaml's one-shot jobs (writing the NATS authority and its test TLS certificates, the
# worker registering itself) run shell scripts: the same binaries on Debian with a shell and
# openssl. Not for production.
FROM debian:bookworm-slim AS shell
# Debian's current ca-certificates and openssl, whatever their versions: certificates and TLS
# are what must stay fresh.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates openssl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532

# The default target: the binaries and CA certificates only.
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
