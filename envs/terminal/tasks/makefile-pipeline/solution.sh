#!/bin/bash
set -euo pipefail
cat > /app/pipeline/Makefile <<'MAKE'
SRCS := $(sort $(wildcard src/*.csv))

.PHONY: all clean

all: build/merged.csv build/stats.txt

build/merged.csv: $(SRCS) | build
	echo 'name,score' > $@.tmp
	for f in $(SRCS); do tail -n +2 "$$f" >> $@.tmp; done
	mv $@.tmp $@

build/stats.txt: build/merged.csv
	awk -F, 'NR > 1 { n++; s += $$2 } END { printf "rows=%d\ntotal=%d\n", n, s }' $< > $@

build:
	mkdir -p build

clean:
	rm -rf build
MAKE
