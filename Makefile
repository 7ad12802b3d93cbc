# Tether: the two commands are `make demo` and `make test`.
GO        ?= go
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/tether-dev/tether/hub.Version=$(VERSION) -X github.com/tether-dev/tether/edge.Version=$(VERSION)
BIN       := $(CURDIR)/bin
FUZZTIME  ?= 60s
TOOLS     := $(CURDIR)/.tools/bin
STEP_CA_VERSION ?= v0.30.2
TEST_TIMEOUT ?= 12m
BENCH_SIZE ?= full

.PHONY: all build test vet soak demo demo-stop bench bench-quick fuzz deps tools clean

all: build

build: ## build bin/tether and bin/tether-edge (static, stripped)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/tether ./cmd/tether-edge

deps: ## install OpenSSH client/server, systemd-analyze and ansible-core when missing (apt-get as root)
	@./scripts/ensure-deps.sh

tools: $(TOOLS)/step-ca ## test tools built from the Go module proxy (step-ca for the external-CA test)

$(TOOLS)/step-ca:
	@echo "building step-ca $(STEP_CA_VERSION) into $(TOOLS) (once; takes a few minutes)"
	CGO_ENABLED=0 GOBIN=$(TOOLS) $(GO) install github.com/smallstep/certificates/cmd/step-ca@$(STEP_CA_VERSION)

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...

test: deps tools build vet ## everything: unit, fuzz seed corpora, end-to-end with real OpenSSH and step-ca
	TETHER_BIN_DIR=$(BIN) TETHER_STEP_CA=$(TOOLS)/step-ca $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# The long fault runs of SECURITY.md: 5-minute flaps per transport, 100k
# login and join attempts, five stall rounds.
soak: deps tools build ## the fault-injection tests at their long sizes (about 7 minutes)
	TETHER_SOAK=1 TETHER_BIN_DIR=$(BIN) TETHER_STEP_CA=$(TOOLS)/step-ca $(GO) test -count=1 -timeout 60m -run '^TestFault' -v ./e2e/

demo: build ## hub + three agents on this machine; prints the ssh line
	@./scripts/demo.sh start

demo-stop: ## stop the demo processes
	@./scripts/demo.sh stop

# The bench raises the open-files limit to the hard limit: the hub holds one
# descriptor per TCP agent and the simulator one per TCP session.
bench: build ## P1-P8 side by side with OpenSSH, socat, Ansible (bench/README.md); appends to bench/RESULTS.md (< 30 min; BENCH_SIZE=max for 100k agents)
	@./bench/deps.sh
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./bench/cmd/tbench ./bench/cmd/agentsim
	ulimit -n $$(ulimit -Hn) && $(BIN)/tbench -size $(BENCH_SIZE) -bin $(BIN) all

bench-quick: build ## a ~2-minute smoke of every bench scenario at small sizes (appends to bench/RESULTS.md)
	@./bench/deps.sh
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./bench/cmd/tbench ./bench/cmd/agentsim
	ulimit -n $$(ulimit -Hn) && $(BIN)/tbench -size quick -bin $(BIN) all

fuzz: ## run every fuzz target for FUZZTIME each (default 60s)
	@for pkg in $$($(GO) list ./...); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf $(BIN) demo .tools
