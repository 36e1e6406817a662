#!/usr/bin/env bash
# Installs the Debian packages named that are not installed yet (apt-get,
# as root or through sudo); nothing when all are there.
#   tools/install-packages.sh WHO PACKAGE...
# WHO prefixes its lines ("setup", "build-mvapich2"). tools/setup.sh and
# tools/build-mvapich2.sh call it, so both install the same way.
set -euo pipefail

who=${1:?usage: tools/install-packages.sh WHO PACKAGE...}
shift

missing=()
for p in "$@"; do
        status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
        [[ $status == "install ok installed" ]] || missing+=("$p")
done
((${#missing[@]})) || exit 0

echo "$who: installing ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || {
                echo "$who: need root or sudo to install: ${missing[*]}" >&2
                exit 1
        }
        sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# tshark's wireshark-common asks whether non-root users may capture: no
# (dumpcap stays root-only; the capture test runs in a namespace).
if [[ " ${missing[*]} " == *" tshark "* ]] && command -v debconf-set-selections >/dev/null; then
        echo "wireshark-common wireshark-common/install-setuid boolean false" |
                "${sudo[@]}" debconf-set-selections
fi
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
