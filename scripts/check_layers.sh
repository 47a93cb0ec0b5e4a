#!/bin/sh
# The layers of docs/architecture.md, checked on every build (CMake runs this
# before compiling proto/): proto/ < rules/ < offline/ < proxy/.  A layer
# includes nothing of a layer above it, and only proxy/ includes libevent or
# OpenSSL (offline/, the journal tools, opens no socket).
# Usage: scripts/check_layers.sh SOURCE_DIR
cd "${1:-.}" || exit 2
inc='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]'
bad=$(grep -nE "$inc(rules/|offline/|proxy/|event2/|openssl/)" proto/*.c proto/*.h;
      grep -nE "$inc(offline/|proxy/|event2/|openssl/)" rules/*.c rules/*.h;
      grep -nE "$inc(proxy/|event2/|openssl/|sys/socket|netinet/)" offline/*.c offline/*.h)
if [ -n "$bad" ]; then
    echo "layer check: an include that crosses the layers (proto/ < rules/ < offline/ < proxy/, see docs/architecture.md):" >&2
    echo "$bad" >&2
    exit 1
fi
exit 0
