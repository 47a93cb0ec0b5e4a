#!/bin/sh
# The layers of docs/architecture.md, checked on every build (CMake runs this
# before compiling proto/): proto/ < rules/ < offline/ < proxy/.  A layer
# includes nothing of a layer above it, and only proxy/ includes libevent or
# OpenSSL (offline/, the journal tools, opens no socket); proto/ and rules/
# open no file either: the program hands them bytes or a stream.  A folder's
# internal header (proxy/FOLDER/NAME_internal.h) is included by the files of that folder only.
# Usage: scripts/check_layers.sh SOURCE_DIR
cd "${1:-.}" || exit 2
inc='^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"]'
proto_files=$(find proto -name '*.[ch]' | sort)
bad=$(grep -nE "$inc(rules/|offline/|proxy/|event2/|openssl/)" $proto_files;
      grep -nE "$inc(offline/|proxy/|event2/|openssl/)" rules/*.c rules/*.h;
      grep -nE "$inc(proxy/|event2/|openssl/|sys/socket|netinet/)" offline/*.c offline/*.h)
# proto/ and rules/ are handed bytes or a stream; they open no file
opens=$(grep -nE '(^|[^_[:alnum:]])(fopen|open|opendir|socket)[[:space:]]*\(' $proto_files rules/*.c)
[ -z "$opens" ] || bad="$bad${bad:+
}$opens"
# a folder's internal header (proxy/resp/resp_internal.h) is for the files of that folder only
proxy_files=$(find proxy -name '*.[ch]' | sort)
for h in $(find proxy -name '*_internal.h' | sort); do
    dir=$(dirname "$h")
    for f in $(grep -lE "$inc$h\"" $proto_files rules/*.[ch] offline/*.[ch] $proxy_files tests/unit/*/*.c tests/lib/*.h 2>/dev/null); do
        [ "$(dirname "$f")" = "$dir" ] ||
            bad="$bad${bad:+
}$f: includes $h, which only the files of $dir/ may"
    done
done
# a unit test's folder is its layer (tests/unit/<layer>/, tests/README.md): it includes nothing
# of a layer above it, itself or through the kit headers (tests/lib/) it includes
above() {
    case $1 in
    proto) echo 'rules/|offline/|proxy/' ;;
    rules) echo 'offline/|proxy/' ;;
    offline) echo 'proxy/' ;;
    esac
}
for t in tests/unit/*/test_*.c; do
    [ -e "$t" ] || continue
    layer=$(basename "$(dirname "$t")")
    up=$(above "$layer")
    [ -n "$up" ] || continue
    kits=$(sed -nE 's@^[[:space:]]*#[[:space:]]*include[[:space:]]*"(tests/lib/[^"]*)".*@\1@p' "$t")
    for f in "$t" $kits; do
        hits=$(grep -nE "$inc($up)" "$f") || continue
        bad="$bad${bad:+
}$f: $hits (in a $layer test: $t)"
    done
done
if [ -n "$bad" ]; then
    echo "layer check: an include or a file opened across the layers (proto/ < rules/ < offline/ < proxy/, see docs/architecture.md):" >&2
    echo "$bad" >&2
    exit 1
fi
exit 0
