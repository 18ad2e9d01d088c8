#!/usr/bin/env bash
# Gathers the photos of the README's conversion: the 21 sample photos of scikit-image and
# matplotlib (pip) to train on, and the 25 cross-source photos (debian_photos --set cross) to
# validate and test on, from five Debian packages that are downloaded and unpacked into a cache
# (apt-get download + dpkg-deb -x), not installed: no desktop is pulled in and no root is needed
# once the package lists exist. Safe to run again: each step is skipped when done.
#
#   bash launch/setup_photos.sh [TRAIN_DIR] [CROSS_DIR]   (default workdirs/photos workdirs/cross)
set -euo pipefail
cd "$(dirname "$0")/.."
TRAIN_DIR=${1:-workdirs/photos}
CROSS_DIR=${2:-workdirs/cross}
DEBS=${LINVIT_DEB_DIR:-$HOME/.cache/linvit_jax/debs}
PACKAGES="lxqt-themes gnome-taquin libjxl-testdata puzzle-jigsaw libsixel-examples"

if [ ! -f .venv/bin/python ]; then
  bash launch/setup_local.sh
fi
.venv/bin/python -m linvit_jax.data.sample_photos "$TRAIN_DIR"

mkdir -p "$DEBS/archives" "$DEBS/root"
for package in $PACKAGES; do
  if ! ls "$DEBS/archives/${package}"_*.deb >/dev/null 2>&1; then
    if ! (cd "$DEBS/archives" && apt-get download -qq "$package" 2>/dev/null); then
      if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        apt-get update -qq && (cd "$DEBS/archives" && apt-get download -qq "$package")
      else
        echo "cannot download the Debian package $package: run 'sudo apt-get update' and retry" >&2
        exit 1
      fi
    fi
  fi
done
for deb in "$DEBS"/archives/*.deb; do
  dpkg-deb -x "$deb" "$DEBS/root"
done
.venv/bin/python -m linvit_jax.data.debian_photos "$CROSS_DIR" --set cross \
  --share_dir "$DEBS/root/usr/share"
