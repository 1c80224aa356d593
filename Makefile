# Convenience wrapper around CMake for people who just want to build and test.
#   make          install missing packages, configure, build
#   make test     ... and run the whole test suite
#   make bench    ... and run the benchmarks (writes JSON under bench/results)
BUILD ?= build/release
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test bench clean

all: build

deps:
	@bash scripts/install_deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/bench/bench_gemm --json bench/results/gemm.json

clean:
	rm -rf $(BUILD)
