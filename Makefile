# Tether: the two commands are `make demo` and `make test`.
GO        ?= go
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/tether-dev/tether/hub.Version=$(VERSION) -X github.com/tether-dev/tether/edge.Version=$(VERSION)
BIN       := $(CURDIR)/bin
FUZZTIME  ?= 60s
TOOLS     := $(CURDIR)/.tools/bin
STEP_CA_VERSION ?= v0.30.2
# nfpm builds the .deb/.rpm; v2.44.0 is the newest whose dependencies are all
# on the Go module proxy.
NFPM_VERSION ?= v2.44.0
DIST      := $(CURDIR)/dist
# The package version: the release tag without its v (v1.2.3 -> 1.2.3, with
# commits after it 1.2.3.4.gHASH), or 0.0.0~gitDATE.HASH before the first
# tag (~ sorts before every release in dpkg and rpm).
PKG_VERSION ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null) && echo "$${v\#v}" | tr - . || echo "0.0.0~git$$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null || echo 0).$$(git rev-parse --short HEAD 2>/dev/null || echo dev)")
# A guard against a hung test, not a budget: the e2e package takes 6-10 min
# on 2 cores (CI allows 90; `make test` should stay well under 15).
TEST_TIMEOUT ?= 20m
BENCH_SIZE ?= full

.PHONY: all build package test vet soak demo demo-stop bench bench-quick fuzz deps tools clean ui-assets depaware pkgmap

all: build

# The agent speaks HTTP only for its one join request (HTTP/1.1 is enough),
# so it leaves out net/http's bundled HTTP/2. The interactive onboarding
# form (a terminal UI, 2.5 MB) is the separate executable
# tether-edge-onboard, which `tether-edge onboard` runs when it asks on a
# terminal: the long-running agent is built without it (tag noform).
# EDGE_TAGS=nethttpomithttp2 builds an all-in-one tether-edge.
EDGE_TAGS ?= nethttpomithttp2 noform
FORM_TAGS ?= nethttpomithttp2

build: ## build bin/tether, bin/tether-edge and bin/tether-edge-onboard (static, stripped)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/tether
	CGO_ENABLED=0 $(GO) build -trimpath -tags "$(EDGE_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/tether-edge
	CGO_ENABLED=0 $(GO) build -trimpath -tags "$(FORM_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/tether-edge-onboard

package: build $(TOOLS)/nfpm ## .deb and .rpm of tether and tether-edge (units, conffiles, maintainer scripts) into dist/
	rm -f $(DIST)/*.deb $(DIST)/*.rpm
	NFPM=$(TOOLS)/nfpm ./packaging/package.sh $(BIN) $(DIST) '$(PKG_VERSION)'

# The web console's terminal: xterm.js 3.8.1 and its fit add-on from the
# Debian package node-xterm, bundled for the browser by esbuild (a Go
# module, run from the Go module proxy at a pinned version). The output in
# hub/ui/assets/vendor/ is committed and embedded, so `go build` and `make`
# need neither; this target re-creates it byte for byte (SHA256SUMS there;
# TestVendoredAssets holds the embedded files to it).
XTERM_DEB_VERSION ?= 3.8.1+~cs0.9.0-1+deb12u1
ESBUILD_VERSION   ?= v0.25.12
UI_VENDOR         := hub/ui/assets/vendor
ui-assets: ## rebuild the console's vendored xterm.js (needs Debian node-xterm $(XTERM_DEB_VERSION) and the Go module proxy)
	@test "$$(dpkg-query -W -f='$${Version}' node-xterm 2>/dev/null)" = '$(XTERM_DEB_VERSION)' || \
	  { echo "need Debian node-xterm $(XTERM_DEB_VERSION): apt-get install -y node-xterm" >&2; exit 1; }
	NODE_PATH=/usr/share/nodejs $(GO) run github.com/evanw/esbuild/cmd/esbuild@$(ESBUILD_VERSION) hub/ui/web/xterm-entry.js \
	  --bundle --format=iife --minify --platform=browser --legal-comments=eof --log-level=warning --outfile=$(UI_VENDOR)/xterm.js
	cp /usr/share/nodejs/xterm/lib/xterm.css $(UI_VENDOR)/xterm.css
	cp /usr/share/doc/node-xterm/copyright $(UI_VENDOR)/xterm.COPYRIGHT
	cd $(UI_VENDOR) && sha256sum xterm.js xterm.css > SHA256SUMS

deps: ## install OpenSSH client/server, systemd-analyze, ansible-core, rpm, cloud-init and chromium when missing (apt-get as root)
	@./scripts/ensure-deps.sh

tools: $(TOOLS)/step-ca $(TOOLS)/nfpm ## tools built from the Go module proxy (step-ca for the external-CA test, nfpm for packages)

$(TOOLS)/nfpm:
	CGO_ENABLED=0 GOBIN=$(TOOLS) $(GO) install github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION)

$(TOOLS)/step-ca:
	@echo "building step-ca $(STEP_CA_VERSION) into $(TOOLS) (once; takes a few minutes)"
	CGO_ENABLED=0 GOBIN=$(TOOLS) $(GO) install github.com/smallstep/certificates/cmd/step-ca@$(STEP_CA_VERSION)

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...

test: deps tools build vet ## everything: unit, fuzz seed corpora, end-to-end with real OpenSSH and step-ca
	TETHER_BIN_DIR=$(BIN) TETHER_STEP_CA=$(TOOLS)/step-ca TETHER_NFPM=$(TOOLS)/nfpm $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

# Each binary's third-party packages are listed in cmd/*/depaware.txt (for
# linux/amd64 and the tags above); TestDepaware in each fails when the build
# and the list differ. After a reviewed dependency change, rewrite them:
depaware: ## rewrite cmd/*/depaware.txt, the third-party packages each binary links (then review the diff)
	TETHER_DEPAWARE_UPDATE=1 $(GO) test -count=1 -run '^TestDepaware$$' ./cmd/tether ./cmd/tether-edge ./cmd/tether-edge-onboard

# docs/design/packages.md lists every package with the first sentence of its
# package comment; TestPackageMap (internal/pkgmap) fails when it drifts.
pkgmap: ## rewrite docs/design/packages.md, the package map, from go list and the package comments
	$(GO) run ./internal/pkgmap -o docs/design/packages.md

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

bench-quick: build ## every bench scenario (P1-P13) at small sizes, about 7 minutes on 2 cores (appends to bench/RESULTS.md)
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
	rm -rf $(BIN) $(DIST) demo quickstart .tools
