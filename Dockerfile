# Builds every palisade binary into one image; compose.yaml picks the command per service.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bins

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/palisade /src/target/release/palisade-admission \
    /src/target/release/palisade-dispatch /src/target/release/palisade-ingestion \
    /src/target/release/palisade-enrichment /src/target/release/palisade-reaper \
    /src/target/release/palisade-worker /usr/local/bin/
USER 65532:65532
