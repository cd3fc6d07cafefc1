#!/usr/bin/env bash
# On this machine: copy pytest-xdist and execnet (pure Python) from .venv into
# .gpu-stack/extra, which git ignores, so that a device call that carries it can run the GPU
# tests in parallel workers (the device has pytest but not xdist; it downloads nothing).
#   bash scripts/gpu_extra.sh   then carry ".gpu-stack/extra" (device_tests.sh finds it)
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
dest=.gpu-stack/extra
rm -rf "$dest" && mkdir -p "$dest"
for pattern in xdist 'pytest_xdist-*.dist-info' execnet 'execnet-*.dist-info'; do
  matches=("$site"/$pattern)
  [ -e "${matches[0]}" ] || { echo "gpu_extra.sh: $pattern not in $site (make install first)" >&2; exit 1; }
  cp -r "${matches[@]}" "$dest/"
done
find "$dest" -name __pycache__ -prune -exec rm -rf {} +
echo "$dest: $(du -sh "$dest" | cut -f1) ($(ls "$dest" | tr '\n' ' '))"
