#!/usr/bin/env bash
# Provides the real repository tests/sandbox_fidelity.rs builds SWE-bench-style instances from
# (idempotent, cached outside the repository): the sdists of consecutive releases of
# more-itertools (a small pure-Python library whose sdists carry its test suite), downloaded
# with pip into $SORFT_FIDELITY_CACHE (default /var/tmp/sorft-fidelity). Offline, copy the
# tarballs there by hand. Needs a pip: $SORFT_FIDELITY_PIP or /opt/sorft-pytest/bin/pip.
set -euo pipefail
CACHE="${SORFT_FIDELITY_CACHE:-/var/tmp/sorft-fidelity}"
PIP="${SORFT_FIDELITY_PIP:-/opt/sorft-pytest/bin/pip}"
VERSIONS=(10.1.0 10.2.0 10.3.0 10.4.0)
mkdir -p "$CACHE"
for v in "${VERSIONS[@]}"; do
    f="$CACHE/more-itertools-$v.tar.gz"
    [[ -s "$f" ]] && continue
    "$PIP" download -q --no-deps --no-binary :all: -d "$CACHE" "more-itertools==$v"
    [[ -s "$f" ]] || { echo "fidelity-deps: $f was not downloaded" >&2; exit 1; }
done
echo "$CACHE"
