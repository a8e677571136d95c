#!/bin/bash
# Usage: sync_txt.sh SRC_DIR DEST_DIR
#
# Copies every regular file whose name ends in ".txt" (case-sensitive) from
# the top level of SRC_DIR (not from its subdirectories) into DEST_DIR,
# creating DEST_DIR (and any missing parents) first. Existing files in
# DEST_DIR with the same name are overwritten. Directory and file names may
# contain spaces. Finally prints one line: "copied N files", where N is the
# number of files copied (also when N is 0), and exits with status 0.
#
# When SRC_DIR is not a directory, prints "sync_txt: no such directory: SRC_DIR"
# to standard error and exits with status 1.

src=$1
dest=$2

if [ ! -d $src ]; then
    echo "sync_txt: no such directory: $src"
    exit 1
fi

mkdir $dest
count=0
ls $src | grep .txt | while read name; do
    cp $src/$name $dest/
    count=$((count + 1))
done
echo "copied $count files"
