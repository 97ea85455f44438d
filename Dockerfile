# sluice: multi-stage build. The event store (badger) is pure Go, so the
# binary is static (CGO_ENABLED=0) and the runtime image has no libc.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t sluice .
#   (or `make image`; without VERSION the binary reports "dev": the build
#   context has no .git to ask)
#   docker run -p 7777:7777 -v sluice-data:/data sluice            # sluice relay
#   docker run -p 7777:7777 sluice proxy --upstream ws://relay:8080

# The exact toolchain go.mod asks for: the golang images set
# GOTOOLCHAIN=local, so a cached golang:1.26 older than 1.26.8 would refuse
# to build rather than fetch a newer Go.
ARG GO_VERSION=1.26.8
FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/sluice ./cmd/sluice \
 && mkdir -p /out/data

# distroless publishes no version tags, only moving ones such as nonroot;
# for a reproducible image pin it by digest (…:nonroot@sha256:…).
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
LABEL org.opencontainers.image.title="sluice" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.source="https://github.com/sluice-relay/sluice"
COPY --from=build /out/sluice /usr/local/bin/sluice
# Owned by the image's nonroot user, so a fresh named volume is writable.
COPY --from=build --chown=65532:65532 /out/data /data
# In a container the relay must listen beyond loopback; metrics stay on
# their own port (publish it only where Prometheus can reach it). These
# variables outrank a mounted config file's listen, metrics_listen and
# data_dir: override them with -e or with flags, not in the file.
ENV SLUICE_LISTEN=0.0.0.0:7777 \
    SLUICE_METRICS_LISTEN=0.0.0.0:9777 \
    SLUICE_DATA_DIR=/data
VOLUME /data
EXPOSE 7777 9777
USER nonroot:nonroot
# The image has no shell or curl: the health check is sluice itself, asking
# /readyz on SLUICE_METRICS_LISTEN (exit 0 ready, 1 not). It reads the same
# SLUICE_* variables as the server; if you move the metrics listener with a
# flag or turn it off, override this (or pass --url).
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/sluice", "health"]
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["relay"]
