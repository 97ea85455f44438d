# sluice — make targets. Quick start: `make run`, `make test`.
#
#   make run      a relay on 127.0.0.1:7777 with the built-in config: memory
#                 limits (no Redis), events in ./data, metrics on 127.0.0.1:9777
#   make test     every test of the module and of the example modules
#                 (RACE=-race for the race detector, as CI does)
#   make bench    the Go benchmarks, briefly (BENCHTIME=1s)
#   make fuzz     every fuzz target for FUZZTIME each (default 20s)
#   make lint     gofmt, go vet (and staticcheck when installed)
#   make cross    go build ./... for every GOOS in CROSS_GOOS (as CI does)
#   make build    bin/sluice
#   make load     bin/sluice-load, the load tool (docs/BENCHMARKS.md)
#   make image    the Docker image sluice:$(VERSION), the version stamped in
#   make compose  docker compose up --build with SLUICE_VERSION=$(VERSION)

GO        ?= go
BIN       ?= bin/sluice
RACE      ?=
TESTFLAGS ?=
BENCHTIME ?= 1s
FUZZTIME  ?= 20s
CROSS_GOOS ?= windows darwin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)

# Nested modules (examples/khatru, examples/rely, …): every directory below
# examples/ that has its own go.mod.
EXAMPLE_MODULES := $(sort $(dir $(wildcard examples/*/go.mod examples/*/*/go.mod)))

# Packages whose end-to-end tests are built only without -race (their
# relay frameworks or clients race on their own; see the files' comments).
# With RACE set, `make test` runs those packages a second time without it,
# so they are never left out.
NORACE_PKGS := $(sort $(patsubst %/,./%,$(dir $(shell grep -rl --include='*_test.go' --exclude-dir=examples '^//go:build !race' . 2>/dev/null | sed 's|^\./||'))))

.PHONY: run test bench fuzz lint cross build load image compose clean

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/sluice

load:
	$(GO) build -trimpath -o bin/sluice-load ./cmd/sluice-load

# The build context has no .git, so the version is passed in.
image:
	docker build --build-arg VERSION=$(VERSION) -t sluice:$(VERSION) .

compose:
	SLUICE_VERSION=$(VERSION) docker compose up --build

# No --listen or --data-dir here: their defaults are 127.0.0.1:7777 and
# ./data, and a flag would outrank SLUICE_LISTEN and SLUICE_DATA_DIR.
# RUNFLAGS adds flags: make run RUNFLAGS='--redis redis://127.0.0.1:6379/0'.
RUNFLAGS ?=
run: build
	./$(BIN) relay $(RUNFLAGS)

# Every part runs even when an earlier one fails, so one run reports all
# failures; the target fails if any part did.
test:
	@status=0; \
	echo "$(GO) test $(RACE) $(TESTFLAGS) ./..."; \
	$(GO) test $(RACE) $(TESTFLAGS) ./... || status=1; \
	if [ -n "$(strip $(RACE))" ] && [ -n "$(strip $(NORACE_PKGS))" ]; then \
		echo "$(GO) test $(TESTFLAGS) $(NORACE_PKGS)   # end-to-end tests built without -race"; \
		$(GO) test $(TESTFLAGS) $(NORACE_PKGS) || status=1; \
	fi; \
	for m in $(EXAMPLE_MODULES); do \
		echo "== $$m"; \
		(cd $$m && $(GO) test $(RACE) $(TESTFLAGS) ./...) || status=1; \
		if [ -n "$(strip $(RACE))" ] && grep -rlq --include='*_test.go' '^//go:build !race' $$m; then \
			(cd $$m && $(GO) test $(TESTFLAGS) ./...) || status=1; \
		fi; \
	done; \
	if ! command -v redis-server >/dev/null 2>&1 && [ -z "$$REQUIRE_REDIS" ] && [ "$$CI" != true ]; then \
		echo "make test: NOTE redis-server is not installed: the tests of the Redis store, Sentinel, Cluster and the shared-Redis end-to-end tests were SKIPPED (install redis-server, or set REQUIRE_REDIS=1 to make that a failure)"; \
	fi; \
	if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && [ -z "$$REQUIRE_POSTGRES" ] && [ "$$CI" != true ]; then \
		echo "make test: NOTE PostgreSQL is not installed: the tests of sluice relay's shared event store were SKIPPED (install Debian's postgresql, or set REQUIRE_POSTGRES=1 to make that a failure)"; \
	fi; \
	if ! { command -v node && command -v npm; } >/dev/null 2>&1 && [ -z "$$CI" ]; then \
		echo "make test: NOTE node or npm is not installed: the tests of sluice proxy in front of a TypeScript relay were SKIPPED (install nodejs and npm, or set CI=1 to make that a failure)"; \
	fi; \
	exit $$status

bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -count 1 ./...

# One `go test -fuzz` per target: Go fuzzes a single target at a time.
fuzz:
	@set -e; grep -rl --include='*_test.go' --exclude-dir=examples '^func Fuzz' . | while read -r f; do \
		pkg=./$$(dirname $${f#./}); \
		for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "== $$pkg $$fn"; \
			$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg; \
		done; \
	done

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@set -e; for m in $(EXAMPLE_MODULES); do (cd $$m && $(GO) vet ./...); done
	@if command -v staticcheck >/dev/null 2>&1; then staticcheck ./...; else echo "staticcheck not installed; skipped"; fi

# The module builds beyond Linux: what is system-specific (the tap's direct
# socket write, the unsent-bytes probe, a test server's SIGSTOP) has a
# portable fallback. Without cgo, which a cross build would need a C
# toolchain for.
cross:
	@set -e; for os in $(CROSS_GOOS); do \
		echo "GOOS=$$os $(GO) build ./..."; \
		CGO_ENABLED=0 GOOS=$$os $(GO) build ./...; \
	done

clean:
	rm -rf bin
