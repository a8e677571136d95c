#!/bin/bash
set -euo pipefail
cd /app/corpus
cat ./*.txt | tr -cs 'A-Za-z' '\n' | tr 'A-Z' 'a-z' | grep -v '^$' \
  | grep -vxF -f stopwords.list | LC_ALL=C sort | uniq -c \
  | LC_ALL=C sort -k1,1nr -k2,2 | head -n 10 | awk '{print $1, $2}' > /app/top_words.txt
