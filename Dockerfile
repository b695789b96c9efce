# Image with the rollout CLI, the worker binaries, the sandbox server and the stand-in
# inference server, for docker-compose.yml and for clusters (convert with
# `apptainer build rollout.sif docker-daemon://rollout:latest`, or build
# deploy/apptainer/rollout.def from a release build).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bins

FROM debian:bookworm-slim
# What workers run sandboxes with: bubblewrap (the default backend), slirp4netns and
# iproute2 (sandboxes with network), git (workspace diffs, SWE tasks), Python and pytest
# (the python tool, code and SWE graders), e2fsprogs (workspace disk quotas).
RUN apt-get update && apt-get install -y --no-install-recommends \
      ca-certificates bubblewrap slirp4netns iproute2 git python3 python3-pytest e2fsprogs \
    && rm -rf /var/lib/apt/lists/*
# The sandbox server must sit beside the workers: they start it in every sandbox.
COPY --from=build /src/target/release/rollout /src/target/release/rollout-init-worker \
     /src/target/release/rollout-run-worker /src/target/release/rollout-eval-worker \
     /src/target/release/rollout-sandbox /src/target/release/rollout-scripted-llm \
     /usr/local/bin/
ENV ROLLOUT__STATE_DIR=/var/lib/rollout
ENTRYPOINT ["rollout"]
