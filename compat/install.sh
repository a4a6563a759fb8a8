#!/usr/bin/env bash
# Installs the pinned real stream consumers the differential test (crates/docsfab-compat) runs:
#   Python: openai, anthropic (compat/requirements.txt) in a venv under target/compat/venv
#   Node:   openai, @mariozechner/pi-ai (compat/package.json + package-lock.json) in target/compat/node
# Idempotent: a marker records what was installed; when it matches, nothing is done.
# Concurrent callers are serialised by a lock file, so parallel tests never install twice at once.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${DOCSFAB_COMPAT_DIR:-$here/../target/compat}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
marker="$dest/installed.txt"

python="${PYTHON:-python3}"
for tool in "$python" node npm flock; do
  command -v "$tool" >/dev/null || { echo "compat/install.sh: '$tool' is not on PATH; install it first" >&2; exit 1; }
done

# Everything that decides the installed set; a change in any of it reinstalls.
want="$(
  echo "python $("$python" -c 'import sys; print(sys.version.split()[0])')"
  echo "node $(node --version)"
  grep -v '^#' "$here/requirements.txt"
  sha256sum "$here/package.json" "$here/package-lock.json" | sed "s#  .*/#  #"
)"

exec 9>"$dest/install.lock"
flock 9
if [[ -f "$marker" && "$(cat "$marker")" == "$want" ]]; then
  echo "compat clients already installed in $dest"
  exit 0
fi
rm -f "$marker"

echo "compat/install.sh: installing pinned clients into $dest" >&2
if [[ ! -x "$dest/venv/bin/python" ]]; then
  rm -rf "$dest/venv"
  "$python" -m venv "$dest/venv"
fi
"$dest/venv/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$here/requirements.txt"

mkdir -p "$dest/node"
cp "$here/package.json" "$here/package-lock.json" "$dest/node/"
# No install scripts: none of the code paths the test uses needs one.
(cd "$dest/node" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)

printf '%s\n' "$want" >"$marker"
echo "compat clients installed in $dest"
