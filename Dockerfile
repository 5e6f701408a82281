# radixgate's container image: a static (musl) binary on an empty base.
#
#   docker build -t radixgate:0.1.0 .
#
# The builder is the Rust toolchain the repository pins (rust-toolchain.toml;
# a test keeps the two equal) on Alpine, whose target is musl, so the binary
# links statically: the final image holds that binary, a CA bundle for
# https workers, and nothing else (no shell, no package manager). It runs as
# the unprivileged user 65532, which the Helm chart's securityContext names.

FROM rust:1.95.0-alpine AS build
# C compilers for ring (rustls' crypto) and mimalloc, musl's headers, and
# the CA bundle copied into the final image.
RUN apk add --no-cache musl-dev gcc ca-certificates
WORKDIR /src
COPY . .
# The image's toolchain is the pinned one; this stops rustup from reading
# rust-toolchain.toml and fetching its components (rustfmt, clippy), which
# a build does not need.
ENV RUSTUP_TOOLCHAIN=1.95.0 CARGO_INCREMENTAL=0
RUN cargo build --release --locked -p radixgate --bin radixgate \
 && cp target/release/radixgate /radixgate

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /radixgate /radixgate
USER 65532:65532
# The router's port (server.port); /metrics is served on it too.
EXPOSE 30000
ENTRYPOINT ["/radixgate"]
CMD ["serve", "--host", "0.0.0.0"]
