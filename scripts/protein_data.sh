#!/usr/bin/env bash
# Builds data/protein.lmdb, the record store of configs/protein.toml (the
# protein sequence autoencoder, docs/autoencoder.md), from the protein FASTA
# files of Debian's hmmer-examples and t-coffee-examples (scripts/fetch_data.sh
# installs both). Usage: scripts/protein_data.sh BRISK_BINARY [OUT_STORE]
#
# The files are listed by hand: the packages also hold DNA/RNA (dna_target.fa,
# 3box-alitest, ecori, sample_dnaseq*, sample_rnaseq1, three_cdna, c18orf19,
# sample_dna_thread, proteases_small_dna), random sequences (rndseq400-10), a
# 20-letter toy alignment (20aa-alitest) and a file of empty records
# (proteases_pair), none of which a protein autoencoder should learn from. A
# listed file that turns out to be mostly A/C/G/T/U/N stops the script.
# Gzipped files are unpacked into data/raw/protein/ first (fasta2lmdb
# memory-maps plain files). Many files repeat sequences of others; the
# trainer keeps each distinct sequence once.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
brisk="${1:?usage: scripts/protein_data.sh BRISK_BINARY [OUT_STORE]}"
out="${2:-$root/data/protein.lmdb}"
# Paths given relative to the caller's directory, before the cd below.
case "$brisk" in /*) ;; */*) brisk="$PWD/$brisk" ;; esac  # a bare name is looked up on PATH
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cd "$root"

# Where Debian puts a package's examples, or where fetch_data.sh unpacks them.
find_dir() {  # $1 = package, $2 = path under /usr/share/doc
  for d in "/usr/share/doc/$2" "third_party/debian/$1/usr/share/doc/$2"; do
    [ -d "$d" ] && { echo "$d"; return; }
  done
  echo "protein_data: $2 not found: run scripts/fetch_data.sh (it installs Debian's $1)" >&2
  exit 1
}
hmmer=$(find_dir hmmer-examples hmmer/examples)
tcoffee=$(find_dir t-coffee-examples t-coffee/examples)

files=(
  "$hmmer/tutorial/globins45.fa" "$hmmer/tutorial/HBB_HUMAN" "$hmmer/testsuite/PAX8_HUMAN"
  "$hmmer/easel/demotic/examples/example-single.fa.gz" "$hmmer/easel/demotic/examples/example.fa"
  "$hmmer/easel/demotic/examples/example-single-psiquery.fa"
  "$tcoffee/proteases_large.fasta.gz" "$tcoffee/proteases_large.coded.fasta.gz" "$tcoffee/proteases_chain.fasta.gz"
  "$tcoffee/proteases_small.fasta" "$tcoffee/proteases1_small.fasta" "$tcoffee/proteases2_small.fasta"
  "$tcoffee/proteases_oneseq.fasta" "$tcoffee/profile1_pdb1.fasta" "$tcoffee/profile2_pdb2.fasta"
  "$tcoffee/b11.fa" "$tcoffee/sample_prot_thread.fa" "$tcoffee/sample_seq1.fasta" "$tcoffee/sv.fasta"
  "$tcoffee/sample_3Dseq1.fasta" "$tcoffee/sample_3Dseq2.fasta" "$tcoffee/group_3Dseq1.fasta"
  "$tcoffee/three_pdb.fasta" "$tcoffee/three_pdb_two_seq.fasta"
)

raw=data/raw/protein
rm -rf "$raw"
mkdir -p "$raw"
inputs=()
for f in "${files[@]}"; do
  name=$(basename "$f" .gz)
  case "$f" in
    "$hmmer"/*) name="hmmer_$name" ;;
    *) name="tcoffee_$name" ;;
  esac
  zcat -f "$f" >"$raw/$name"
  # A DNA file here would be a mistake in the list above.
  if grep -v '^[>;]' "$raw/$name" | tr -d ' \t\r\n' | awk '{ n += length($0); gsub(/[^ACGTUNacgtun]/, ""); d += length($0) }
       END { exit !(n > 0 && d / n > 0.9) }'; then
    echo "protein_data: $f looks like DNA/RNA, not protein" >&2
    exit 1
  fi
  inputs+=("$raw/$name")
done

mkdir -p "$(dirname "$out")"
rm -f "$out"
"$brisk" data fasta2lmdb --no-progress --out "$out" --input "$(IFS=,; echo "${inputs[*]}")"
