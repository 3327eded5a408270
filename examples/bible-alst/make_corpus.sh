#!/bin/bash
# Writes the King James Bible as one plain UTF-8 text file, one verse per line without its
# reference ("Ge1:1 In the beginning..." -> "In the beginning..."), a blank line between chapters
# (the corpus reader's documents: 1,189, so the held-out split has whole chapters), about 4.1 MB.
# Debian's bible-kjv-text holds it compressed and the bible-kjv reader (`bible`) prints it
# (scripts/install_deps.sh installs both).
# Usage: make_corpus.sh OUTPUT_FILE
set -euo pipefail
out="${1:?usage: make_corpus.sh OUTPUT_FILE}"
command -v bible >/dev/null || { echo "make_corpus.sh: bible not found (apt-get install bible-kjv)" >&2; exit 1; }
bible -f gen1:1-rev22:21 </dev/null |
  awk '{ chapter = $1; sub(/:.*/, "", chapter); if (NR > 1 && chapter != last) print "";
         last = chapter; sub(/^[^ ]* /, ""); print }' > "$out.tmp"
lines=$(grep -c . "$out.tmp")
if [ "$lines" -ne 31102 ]; then
  echo "make_corpus.sh: expected 31102 verses, got $lines" >&2
  rm -f "$out.tmp"
  exit 1
fi
mv "$out.tmp" "$out"
