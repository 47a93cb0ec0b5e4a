#!/bin/sh
# The layers of docs/architecture.md, checked on every build (CMake runs this
# before compiling proto/): proto/ includes nothing of rules/ or proxy/,
# rules/ nothing of proxy/, and neither includes libevent or OpenSSL.
# Usage: scripts/check_layers.sh SOURCE_DIR
cd "${1:-.}" || exit 2
bad=$(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](rules/|proxy/|event2/|openssl/)' proto/*.c proto/*.h;
      grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"](proxy/|event2/|openssl/)' rules/*.c rules/*.h)
if [ -n "$bad" ]; then
    echo "layer check: an include that crosses the layers (proto/ < rules/ < proxy/, see docs/architecture.md):" >&2
    echo "$bad" >&2
    exit 1
fi
exit 0
