#!/usr/bin/env bash
# Installs the pinned LiteLLM proxy (compat/litellm/requirements.txt) into a venv under
# target/litellm/venv, for the gateway tests (crates/docsfab/tests/gateway_litellm.rs).
# Idempotent: a marker records what was installed; when it matches, nothing is done (well under
# a second). Concurrent callers are serialised by a lock file. DOCSFAB_LITELLM_DIR moves it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dest="${DOCSFAB_LITELLM_DIR:-$here/../../target/litellm}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
marker="$dest/installed.txt"

python="${PYTHON:-python3}"
for tool in "$python" flock; do
  command -v "$tool" >/dev/null || { echo "compat/litellm/install.sh: '$tool' is not on PATH; install it first" >&2; exit 1; }
done

# Everything that decides the installed set; a change in any of it reinstalls.
want="$(
  echo "python $("$python" -c 'import sys; print(sys.version.split()[0])')"
  grep -v '^#' "$here/requirements.txt"
)"

exec 9>"$dest/install.lock"
flock 9
if [[ -f "$marker" && "$(cat "$marker")" == "$want" && -x "$dest/venv/bin/litellm" ]]; then
  echo "litellm already installed in $dest"
  exit 0
fi
rm -f "$marker"

echo "compat/litellm/install.sh: installing the pinned LiteLLM proxy into $dest (a few minutes)" >&2
if [[ ! -x "$dest/venv/bin/python" ]]; then
  rm -rf "$dest/venv"
  "$python" -m venv "$dest/venv"
fi
"$dest/venv/bin/python" -m pip install --disable-pip-version-check --no-input --no-cache-dir -q \
  -r "$here/requirements.txt"

printf '%s\n' "$want" >"$marker"
echo "litellm installed in $dest"
