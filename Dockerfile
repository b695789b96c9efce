# Image with the rollout CLI and the three worker binaries, for docker-compose.yml and
# for converting to an Apptainer image on clusters (apptainer build rollout.sif docker-daemon://rollout:latest).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bins

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/rollout /src/target/release/rollout-init-worker \
     /src/target/release/rollout-run-worker /src/target/release/rollout-eval-worker /usr/local/bin/
ENTRYPOINT ["rollout"]
