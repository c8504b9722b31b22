#!/usr/bin/env bash
# Fetches the training corpora by Debian package name (nothing else is downloaded) into data/corpora/:
#   kjv.txt     the King James Bible (packages bible-kjv, bible-kjv-text): `bible -f gen1:1-rev22:21`,
#               one verse a line ("Ge1:1 In the beginning God created the heaven and the earth.")
#   austen.txt  Jane Austen's six novels (package r-cran-janeaustenr): the .deb is downloaded and unpacked,
#               not installed, and the texts are read from R's lazy-load database data/Rdata.rdb/.rdx by
#               tools/corpora/read_rdata.py (Python 3 standard library; R is not needed).
# Usage: scripts/fetch-corpora.sh [kjv] [austen]     (both when none is named). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

out=data/corpora
mkdir -p "$out"
wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(kjv austen)

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=0
apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "fetch-corpora: installing ${missing[*]}"
  if [ $apt_updated -eq 0 ]; then $sudo apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

fetch_kjv() {
  if [ -s "$out/kjv.txt" ]; then echo "fetch-corpora: $out/kjv.txt already there"; return; fi
  apt_install bible-kjv bible-kjv-text
  bible -f gen1:1-rev22:21 > "$out/kjv.txt.tmp"
  mv "$out/kjv.txt.tmp" "$out/kjv.txt"
  echo "fetch-corpora: $out/kjv.txt ($(wc -l < "$out/kjv.txt") verses, $(wc -c < "$out/kjv.txt") bytes)"
}

fetch_austen() {
  if [ -s "$out/austen.txt" ]; then echo "fetch-corpora: $out/austen.txt already there"; return; fi
  command -v python3 > /dev/null || apt_install python3
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  # apt-get download writes into the current directory, as the _apt user when it can.
  chmod 777 "$work"
  (cd "$work" && apt-get download r-cran-janeaustenr 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
  local deb
  deb=$(ls "$work"/r-cran-janeaustenr_*.deb 2>/dev/null | head -n 1)
  if [ -z "$deb" ]; then
    if [ $apt_updated -eq 0 ]; then $sudo apt-get update -qq; apt_updated=1; fi
    (cd "$work" && apt-get download r-cran-janeaustenr)
    deb=$(ls "$work"/r-cran-janeaustenr_*.deb | head -n 1)
  fi
  dpkg-deb -x "$deb" "$work/x"
  local db
  db=$(find "$work/x" -path "*janeaustenr/data/Rdata.rdb" | head -n 1)
  [ -n "$db" ] || db=$(find "$work/x" -path "*janeaustenr/R/sysdata.rdb" | head -n 1)
  [ -n "$db" ] || { echo "fetch-corpora: no Rdata.rdb or sysdata.rdb in $deb" >&2; return 1; }
  # The six novels in publication order.
  python3 tools/corpora/read_rdata.py "${db%.rdb}" sensesensibility prideprejudice mansfieldpark emma \
    northangerabbey persuasion -o "$out/austen.txt.tmp"
  mv "$out/austen.txt.tmp" "$out/austen.txt"
  echo "fetch-corpora: $out/austen.txt ($(wc -l < "$out/austen.txt") lines, $(wc -c < "$out/austen.txt") bytes)"
}

for corpus in "${wanted[@]}"; do
  case "$corpus" in
    kjv) fetch_kjv ;;
    austen) fetch_austen ;;
    *) echo "fetch-corpora: unknown corpus '$corpus' (have kjv, austen)" >&2; exit 2 ;;
  esac
done
