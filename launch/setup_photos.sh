#!/usr/bin/env bash
# Gathers the photos of the README's conversion: a folder to train on and the 25 cross-source
# photos (debian_photos --set cross) to validate and test on. The Debian packages they come from
# are downloaded and unpacked into a cache (apt-get download + dpkg-deb -x), not installed: no
# desktop is pulled in, and no root is needed once the package lists exist. Safe to run again:
# a package already downloaded is not fetched again.
#
#   bash launch/setup_photos.sh [TRAIN_DIR] [CROSS_DIR] [TRAIN_SET] [PEOPLE_DIR]
#
# TRAIN_SET (default all): samples = the 21 sample photos of scikit-image and matplotlib (pip);
# debian = those and the 46 photographs of plasma-workspace-wallpapers, opencv-doc and
# mate-backgrounds; all = those and the 15 lomiri photographs (82 photos; with the cross-source
# packages ~350 MB downloaded, ~600 MB unpacked); more = those and the 74 photographs of seven
# more packages (debian_photos --set extra: 156 photos, ~52 MB more downloaded); most = those and
# the 316 photographs of four more (debian_photos --set scenes: 472 photos, ~93 MB more).
# The cross-source packages: lxqt-themes gnome-taquin libjxl-testdata puzzle-jigsaw
# libsixel-examples. docs/data_study.md compares training folders like these three.
# PEOPLE_DIR (optional): also the 15 photos of people of kphotoalbum and ruby-rmagick-doc
# (debian_photos --set people, ~14 MB more), a test-only folder: docs/data_study.md.
set -euo pipefail
cd "$(dirname "$0")/.."
TRAIN_DIR=${1:-workdirs/photos}
CROSS_DIR=${2:-workdirs/cross}
TRAIN_SET=${3:-all}
PEOPLE_DIR=${4:-}
DEBS=${LINVIT_DEB_DIR:-$HOME/.cache/linvit_jax/debs}
CROSS="lxqt-themes gnome-taquin libjxl-testdata puzzle-jigsaw libsixel-examples"
DEBIAN="plasma-workspace-wallpapers opencv-doc mate-backgrounds"
LOMIRI="lomiri-wallpapers-16.04 lomiri-wallpapers-20.04"
EXTRA="scratch palapeli-data scribus-template libvips-doc node-opencv python-kivy-examples digikam-data"
SCENES="endless-sky-data gnome-control-center-data plasma-workspace-data tuxpaint-data"
PEOPLE="kphotoalbum ruby-rmagick-doc"
case "$TRAIN_SET" in
  samples) PACKAGES="$CROSS" ;;
  debian) PACKAGES="$CROSS $DEBIAN" ;;
  all) PACKAGES="$CROSS $DEBIAN $LOMIRI" ;;
  more) PACKAGES="$CROSS $DEBIAN $LOMIRI $EXTRA" ;;
  most) PACKAGES="$CROSS $DEBIAN $LOMIRI $EXTRA $SCENES" ;;
  *) echo "error: TRAIN_SET must be samples, debian, all, more or most, got '$TRAIN_SET'" >&2; exit 2 ;;
esac
if [ -n "$PEOPLE_DIR" ]; then
  PACKAGES="$PACKAGES $PEOPLE"
fi

if [ ! -x .venv/bin/python ]; then
  bash launch/setup_local.sh
fi

mkdir -p "$DEBS/archives" "$DEBS/root"
for package in $PACKAGES; do
  if ! ls "$DEBS/archives/${package}"_*.deb >/dev/null 2>&1; then
    if ! (cd "$DEBS/archives" && apt-get download -qq "$package" 2>/dev/null); then
      if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        apt-get update -qq && (cd "$DEBS/archives" && apt-get download -qq "$package")
      else
        echo "error: cannot download the Debian package $package: run 'sudo apt-get update' and retry" >&2
        exit 1
      fi
    fi
  fi
  dpkg-deb -x "$(ls "$DEBS/archives/${package}"_*.deb | head -1)" "$DEBS/root"
done

SHARE="$DEBS/root/usr/share"
.venv/bin/python -m linvit_jax.data.debian_photos "$CROSS_DIR" --set cross --share_dir "$SHARE"
if [ "$TRAIN_SET" = samples ]; then
  .venv/bin/python -m linvit_jax.data.sample_photos "$TRAIN_DIR"
else
  .venv/bin/python -m linvit_jax.data.debian_photos "$TRAIN_DIR" --with_samples --share_dir "$SHARE"
fi
if [ "$TRAIN_SET" = all ] || [ "$TRAIN_SET" = more ] || [ "$TRAIN_SET" = most ]; then
  .venv/bin/python -m linvit_jax.data.debian_photos "$TRAIN_DIR" --set lomiri --share_dir "$SHARE"
fi
if [ "$TRAIN_SET" = more ] || [ "$TRAIN_SET" = most ]; then
  .venv/bin/python -m linvit_jax.data.debian_photos "$TRAIN_DIR" --set extra --share_dir "$SHARE"
fi
if [ "$TRAIN_SET" = most ]; then
  .venv/bin/python -m linvit_jax.data.debian_photos "$TRAIN_DIR" --set scenes --share_dir "$SHARE"
fi
if [ -n "$PEOPLE_DIR" ]; then
  .venv/bin/python -m linvit_jax.data.debian_photos "$PEOPLE_DIR" --set people --share_dir "$SHARE"
fi
