#!/usr/bin/env bash
# Installs the Debian packages brisk builds against, when they are missing.
# Idempotent and quiet when there is nothing to do.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-dev libopenblas0-openmp libomp-dev
  libdnnl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch python3-numpy  # tests/models/gpt_torch_check.py (run with /usr/bin/python3)
  nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libxxhash-dev libtomlplusplus-dev
  liblmdb-dev libzstd-dev
  libcpp-httplib-dev  # `brisk serve` (docs/serving.md)
  openmpi-bin libopenmpi-dev  # training over several processes: mpirun, MPI (docs/distributed.md)
  haproxy curl  # deploy/replicas.sh: several `brisk serve` replicas behind a load balancer (deploy/README.md)
  libprotobuf-dev protobuf-compiler libonnx-dev  # `brisk export onnx`: protoc compiles ONNX's onnx.proto
  python3-onnx  # tests/export/check_onnx.py: onnx.checker (run with /usr/bin/python3)
  python3-jsonschema  # tests/serve/check_json_schema.py: validates texts generated under a schema
  python3-protobuf  # tests/monitor/read_tfevents.py: decodes TensorBoard event files (docs/monitoring.md)
  clang libclang-rt-14-dev  # `make fuzz`: clang and its libFuzzer/ASan/UBSan runtimes (docs/fuzzing.md)
  chromium  # tests/report/check_report_browser.py: `brisk report`'s page in headless Chromium (docs/monitoring.md)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
