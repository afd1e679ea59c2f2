# The server (and, in job pods, the runner): one static musl binary in an
# empty image, running as a non-root UID.
#
#   docker build -t mcp-k8s-ephemeral-job:0.1.0 .
#
# BUILDER is the image the binary is compiled in: the public Rust image by
# default; any Debian-like image with rustup, cargo and gcc works (musl-tools
# is installed when missing). tests/docker/build-dockerfile builds this file
# offline with a builder assembled from the host's toolchain and crates
# (`--build-arg BUILDER=...`, with CARGO_NET_OFFLINE set in that image).
# Nothing here needs BuildKit (no `# syntax=` line: it would pull a frontend).
#
# No CA bundle is needed: in-cluster the server trusts the cluster CA from
# its ServiceAccount, and for kubeconfigs without a CA the web PKI roots are
# compiled in (webpki-roots). tests/build-project-image assembles the same
# image without Docker (same path, entrypoint and user) for the test cluster.

# The toolchain the test suite runs with.
ARG BUILDER=rust:1.95-bookworm
FROM ${BUILDER} AS build
RUN command -v musl-gcc >/dev/null \
 || { apt-get update \
      && apt-get install -y --no-install-recommends musl-tools \
      && rm -rf /var/lib/apt/lists/*; }
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# Builds for the platform being built (amd64 or arm64, e.g. with buildx).
RUN target="$(uname -m)-unknown-linux-musl" \
 && { rustup target list --installed | grep -qx "$target" || rustup target add "$target"; } \
 && cargo build --release --locked --target "$target" \
 && cp "target/$target/release/mcp-k8s-ephemeral-job" /mcp-k8s-ephemeral-job

FROM scratch
COPY --from=build /mcp-k8s-ephemeral-job /mcp-k8s-ephemeral-job
# The MCP registry checks this label to verify who publishes the image.
LABEL io.modelcontextprotocol.server.name="io.github.example/mcp-k8s-ephemeral-job"
# 65532 is "nonroot" by convention; pods may override it with runAsUser.
USER 65532:65532
ENTRYPOINT ["/mcp-k8s-ephemeral-job"]
