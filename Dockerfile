# syntax=docker/dockerfile:1
# The server (and, in job pods, the runner): one static musl binary in an
# empty image, running as a non-root UID.
#
#   docker build -t mcp-k8s-ephemeral-job:0.1.0 .
#
# No CA bundle is needed: in-cluster the server trusts the cluster CA from
# its ServiceAccount, and for kubeconfigs without a CA the web PKI roots are
# compiled in (webpki-roots). tests/build-project-image assembles the same
# image without Docker (same path, entrypoint and user) for the test cluster.

# The toolchain the test suite runs with.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Builds for the platform being built (amd64 or arm64, e.g. with buildx).
RUN target="$(uname -m)-unknown-linux-musl" \
 && rustup target add "$target" \
 && cargo build --release --locked --target "$target" \
 && cp "target/$target/release/mcp-k8s-ephemeral-job" /mcp-k8s-ephemeral-job

FROM scratch
COPY --from=build /mcp-k8s-ephemeral-job /mcp-k8s-ephemeral-job
# The MCP registry checks this label to verify who publishes the image.
LABEL io.modelcontextprotocol.server.name="io.github.example/mcp-k8s-ephemeral-job"
# 65532 is "nonroot" by convention; pods may override it with runAsUser.
USER 65532:65532
ENTRYPOINT ["/mcp-k8s-ephemeral-job"]
