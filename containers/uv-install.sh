#!/bin/sh
# nextstate's stand-in for astral.sh's uv installer (`curl -LsSf https://astral.sh/uv/VERSION/install.sh | sh`)
# where astral.sh is not reachable: the uv and uvx beside this script come from uv's wheel on the package
# registry. Like the installer, it puts them in $UV_INSTALL_DIR, else $XDG_BIN_HOME, else $HOME/.local/bin,
# writes an `env` file there that puts that folder on PATH, and sources it from ~/.profile and ~/.bashrc
# (unless UV_NO_MODIFY_PATH is set).
set -eu
here=$(dirname "$0")
bin=${UV_INSTALL_DIR:-${XDG_BIN_HOME:-$HOME/.local/bin}}
mkdir -p "$bin"
cp "$here/uv" "$here/uvx" "$bin/"
chmod 0755 "$bin/uv" "$bin/uvx"
cat > "$bin/env" <<ENV
#!/bin/sh
case ":\${PATH}:" in
    *:"$bin":*) ;;
    *) export PATH="$bin:\$PATH" ;;
esac
ENV
if [ -z "${UV_NO_MODIFY_PATH:-}" ]; then
    for rc in "$HOME/.profile" "$HOME/.bashrc"; do
        grep -qsF ". \"$bin/env\"" "$rc" || printf '\n. "%s/env"\n' "$bin" >> "$rc"
    done
fi
echo "installed $("$bin/uv" --version) to $bin (nextstate: from the package registry; astral.sh is not reachable)"
