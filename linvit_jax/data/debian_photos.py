"""Natural photographs from installed Debian packages, gathered into one folder for evidence runs.

  python -m linvit_jax.data.debian_photos OUT_DIR [--max_side 1920] [--with_samples]
      [--set lomiri|cross|people|extra|scenes] [--share_dir DIR]

The 21 sample photos (sample_photos.py) are small (most under 600 px) and a third of them are
grayscale microscopy or texture: too few and too small to test a student at 448–896 px. Three
Debian packages ship larger natural photographs, installable offline from the distribution's
mirror (`apt-get install plasma-workspace-wallpapers opencv-doc mate-backgrounds`):

* plasma-workspace-wallpapers: 30 KDE wallpapers, up to 5120×2880; the 12 listed in
  `PLASMA_PHOTOS` are photographs (the others are renders and illustrations), written as
  `wall_<Name>.jpg` from each wallpaper's largest image;
* opencv-doc: OpenCV's sample data; the 22 in `OPENCV_PHOTOS` are photographs of scenes and
  objects (calibration boards, stereo pairs, renders, logos and paintings are left out),
  `cv_<name>.jpg`;
* mate-backgrounds: the 12 photographs of `/usr/share/backgrounds/mate/nature`, `mate_<name>.jpg`.

A second, disjoint set (`--set lomiri`) is for a run that trains on other photos than the default
folder: the 15 photographs among the Ubuntu wallpaper-contest images of `lomiri-wallpapers-16.04`
and `lomiri-wallpapers-20.04` (`apt-get install lomiri-wallpapers`, which installs both), listed in
`LOMIRI_PHOTOS` (the renders beside them are left out), written as `lomiri_<name>.jpg`. None of
them is in the first set.

A third set (`--set cross`, `CROSS_PHOTOS`) is for the cross-source test: 25 photographs of five
packages neither other set uses (`apt-get install lxqt-themes gnome-taquin libjxl-testdata
puzzle-jigsaw libsixel-examples`), written as `x_<name>.jpg`: a folder to validate and test on
(`eval_folder=` of configs/convert_folder.py) while training on the others.

A fourth set (`--set people`, `PEOPLE_PHOTOS`) fills the cross set's gap: photographs of people,
the subject that was worst when the default was measured from outside. 15 of them, from two more
packages (`apt-get install kphotoalbum ruby-rmagick-doc`): the 14 demo photos of KPhotoAlbum that
show people (GPL-2+) and RMagick's `Ballerina3` (MIT), written as `p_<name>.jpg`. Four of
KPhotoAlbum's are stored turned and only its album index says so; they are written upright. A
test-only folder: `python -m linvit_jax.compare --photos DIR --val_photos CROSS_DIR`.

A fifth set (`--set extra`, `EXTRA_PHOTOS`) is more to train on: 74 photographs of seven
packages no other set uses (`apt-get install scratch palapeli-data scribus-template libvips-doc
node-opencv python-kivy-examples digikam-data`): the 54 photographed stage backgrounds of Scratch
(480×360: rooms, streets, buildings, sports grounds, landscapes; CC-BY-SA-3.0) and 20 photos of
puzzles, templates and examples, written as `e_<folder>_<name>.jpg`. With the default folder's it
makes 156 (launch/setup_photos.sh's `more`).

A sixth set (`--set scenes`, `SCENES_PHOTOS`) is many more to train on: 316 photographs of four
packages no other set uses (`apt-get install endless-sky-data gnome-control-center-data
plasma-workspace-data tuxpaint-data`): Endless Sky's 267 planet-landing photos (720×360:
landscapes, coasts, cities; public domain and CC-BY-SA), the photo faces and avatars of GNOME's
and Plasma's user accounts (512 px, CC0) and Tux Paint's 15 photo templates, written as
`s_<folder>_<name>.jpg`. With the others it makes 472 (setup_photos.sh's `most`).

Every photo is written as RGB JPEG (quality 95), shrunk (never enlarged) so its longer side is at
most `max_side`: a fixed recipe, so the same packages give the same files and, because held-out
splits hash the file name, the same train / validation / test split on every machine.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Callable, Sequence

from linvit_jax.runtime import errors
from linvit_jax.runtime.errors import UserError

PLASMA_DIR = "/usr/share/wallpapers"
OPENCV_DIR = "/usr/share/doc/opencv-doc/examples/data"
MATE_DIR = "/usr/share/backgrounds/mate/nature"
LOMIRI_DIR = "/usr/share/backgrounds"

PLASMA_PHOTOS = (
    "BytheWater",
    "ColdRipple",
    "ColorfulCups",
    "DarkestHour",
    "EveningGlow",
    "FallenLeaf",
    "Grey",
    "MilkyWay",
    "OneStandsOut",
    "Path",
    "Volna",
    "summer_1am",
)
OPENCV_PHOTOS = (
    "HappyFish.jpg",
    "aero1.jpg",
    "aero3.jpg",
    "aloeL.jpg",
    "apple.jpg",
    "baboon.jpg",
    "basketball1.png",
    "board.jpg",
    "box_in_scene.png",
    "building.jpg",
    "butterfly.jpg",
    "ela_original.jpg",
    "fruits.jpg",
    "graf1.png",
    "home.jpg",
    "leuvenA.jpg",
    "messi5.jpg",
    "orange.jpg",
    "rubberwhale1.png",
    "smarties.png",
    "squirrel_cls.jpg",
    "stuff.jpg",
)
# Photographs only: the contest's renders and illustrations (Fossa, Infinite-Sea, Painting-Colors,
# umang, and the plain backgrounds of /usr/share/backgrounds) are left out.
LOMIRI_PHOTOS = (
    "Bridge_by_Sander_Klootwijk.jpg",
    "Dragonfly_by_Bolly.jpg",
    "Kleiber_by_Lukas_Baubkus.jpg",
    "Picture_0B_by_freespace.jpg",
    "Picture_1A_by_freespace.jpg",
    "Wine_by_Jakkub_Mede.jpg",
    "aitzgorri_by_Aitzol_Berasategi.jpg",
    "analogpattern_by_Peter_Nerlich.jpg",
    "free_by_Peter_Nerlich.jpg",
    "friends_by_Aitzol_Berasategi.jpg",
    "greentock_by_Peter_Nerlich.jpg",
    "life_by_Aitzol_Berasategi.jpg",
    "picosdeeuropa_by_Aitzol_Berasategi.jpg",
    "seeding_by_Clements_Engelhardt.jpg",
    "sunset_by_Aitzol_Berasategi.jpg",
)
# A third set (`--set cross`), for judging a student on photos from other packages than any it
# trained on (the cross-source test): 25 photographs of five packages none of the other sets uses
# (animals, flowers, landscapes, one room; no people: no Debian package found ships photographs of
# people at this size). Each is (package, path under /usr/share); written as `x_<stem>.jpg`.
CROSS_PHOTOS = (
    ("lxqt-themes", "lxqt/wallpapers/Butterfly-Kenneth-Wimer.jpg"),
    ("lxqt-themes", "lxqt/wallpapers/Valendas.png"),
    ("lxqt-themes", "lxqt/wallpapers/after-the-rain.jpg"),
    ("lxqt-themes", "lxqt/wallpapers/appleflower.png"),
    ("lxqt-themes", "lxqt/wallpapers/beam.png"),
    ("lxqt-themes", "lxqt/wallpapers/butterfly.png"),
    ("lxqt-themes", "lxqt/wallpapers/cloud.png"),
    ("lxqt-themes", "lxqt/wallpapers/drop.png"),
    ("lxqt-themes", "lxqt/wallpapers/flowers.png"),
    ("lxqt-themes", "lxqt/wallpapers/fog.jpg"),
    ("lxqt-themes", "lxqt/wallpapers/this-is-not-windows.jpg"),
    ("gnome-taquin", "gnome-taquin/themes/cats/1-Cat_face_day.jpg"),
    ("gnome-taquin", "gnome-taquin/themes/cats/1-Jasmina.jpg"),
    ("gnome-taquin", "gnome-taquin/themes/cats/1-Tortoiseshell.jpg"),
    ("gnome-taquin", "gnome-taquin/themes/cats/1-maine.jpg"),
    ("gnome-taquin", "gnome-taquin/themes/cats/1-march.jpg"),
    ("libjxl-testdata", "libjxl-testdata/jxl/flower/flower.png"),
    ("libjxl-testdata", "libjxl-testdata/jxl/hdr_room.png"),
    ("libjxl-testdata", "libjxl-testdata/external/wesaturate/500px/cvo9xd_keong_macan_srgb8.png"),
    (
        "libjxl-testdata",
        "libjxl-testdata/external/wesaturate/500px/tmshre_riaphotographs_srgb8.png",
    ),
    ("libjxl-testdata", "libjxl-testdata/external/wesaturate/500px/u76c0g_bliznaca_srgb8.png"),
    ("puzzle-jigsaw", "puzzle-jigsaw/samples/cat-animal-cat-portrait-mackerel.jpg"),
    ("puzzle-jigsaw", "puzzle-jigsaw/samples/pexels-photo-302304.jpeg"),
    ("libsixel-examples", "doc/libsixel-examples/examples/images/egret.jpg"),
    ("libsixel-examples", "doc/libsixel-examples/examples/images/snake.jpg"),
)
# The people set (`--set people`): (package, path under /usr/share, the clockwise turn in degrees
# that stands it upright). KPhotoAlbum keeps a photo's turn in its demo album's index.xml, not in
# the file; its demo photos without people (pets, landscapes, feet) are left out, and so are the
# people photos of other packages that are under 224 px, recompressed or of doubtful licence.
KPHOTOALBUM_DEMO = "kphotoalbum/demo"
PEOPLE_PHOTOS = (
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/anne_helene.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/bar55.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/bar55_2.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/cold_water.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/grand_canyon_1.jpg", 180),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/grand_canyon_2.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/jesper.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/jesper_2.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/new_wave_1.jpg", 90),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/new_wave_2.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/pool.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/pool_2.jpg", 270),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/qt-logo.jpg", 0),
    ("kphotoalbum", f"{KPHOTOALBUM_DEMO}/wayne.jpg", 90),
    ("ruby-rmagick-doc", "doc/ruby-rmagick-doc/html/ex/images/Ballerina3.jpg", 0),
)
# A fifth set (`--set extra`), more training photos from packages no other set uses: the 54
# photographs among Scratch's stage backgrounds (480x360: rooms, streets, buildings, sports
# grounds, landscapes; its drawn backgrounds are left out) and 20 from six more packages (puzzle
# photos, template photos, example images: a castle, a bee, fruit, the moon, cars, a cat, a city).
# Each is (package, path under /usr/share); written as `e_<folder>_<stem>.jpg` (two templates
# ship a `moon.jpg`).
SCRATCH_BACKGROUNDS = "scratch/Media/Backgrounds"
EXTRA_PHOTOS = (
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Indoors/chalkboard.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Indoors/clothing-store.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Indoors/hall.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Indoors/kitchen.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Indoors/the-movies-inside.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/beach-malibu.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/canyon.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/flower-bed.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/forest.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/garden-rock.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/grand-canyon.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/gravel-desert.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/hill.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/lake.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/moon.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/pathway.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/tree.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/water-and-rocks.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Nature/wave.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/all-sports-mural.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/atom-playground.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/bench-with-view.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/berkeley-mural.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/boardwalk.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/brick-wall-and-stairs.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/brick-wall1.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/brick-wall2.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/building-at-mit.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/building-fireproof.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/castle.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/city-with-water.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/city-with-water2.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/driveway.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/graffiti.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/hallway_outdoors.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/hay_field.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/houses.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/mansion.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/mural-faro.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/parking-ramp.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/pool.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/route66.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/silos.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/the-movies.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/train-tracks1.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/train-tracks2.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/village.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Outdoors/wooden-house.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Sports/baseball-field.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Sports/basketball-court1-a.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Sports/basketball-court1-b.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Sports/football-field.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Sports/playing-field.jpg"),
    ("scratch", f"{SCRATCH_BACKGROUNDS}/Sports/tennis-backboard.jpg"),
    ("palapeli-data", "palapeli/collection/castle-maintenon.jpg"),
    ("palapeli-data", "palapeli/collection/cincinnati-bridge.jpg"),
    ("palapeli-data", "palapeli/collection/citrus-fruits.jpg"),
    ("palapeli-data", "palapeli/collection/european-honey-bee.jpg"),
    ("palapeli-data", "palapeli/collection/panther-chameleon-female.jpg"),
    ("scribus-template", "scribus/templates/br2/brightness.jpg"),
    ("scribus-template", "scribus/templates/br2/halfmoon.jpg"),
    ("scribus-template", "scribus/templates/br2/moon.jpg"),
    ("scribus-template", "scribus/templates/br2/nature.jpg"),
    ("scribus-template", "scribus/templates/br2/sunset.jpg"),
    ("scribus-template", "scribus/templates/cal2/moon.jpg"),
    ("scribus-template", "scribus/templates/menu2/pizza.jpg"),
    ("libvips-doc", "gtk-doc/html/libvips/owl.jpg"),
    ("node-opencv", "doc/node-opencv/examples/files/car1.jpg"),
    ("node-opencv", "doc/node-opencv/examples/files/car2.jpg"),
    ("python-kivy-examples", "kivy-examples/canvas/kiwi.jpg"),
    ("python-kivy-examples", "kivy-examples/demo/pictures/images/Wall.jpg"),
    ("python-kivy-examples", "kivy-examples/demo/pictures/images/faust_github.jpg"),
    ("python-kivy-examples", "kivy-examples/widgets/cityCC0.png"),
    ("digikam-data", "digikam/about/images/body-background.jpg"),
)
# A sixth set (`--set scenes`), many more training photos: the 267 photographs among Endless
# Sky's planet-landing images (720x360 landscapes, coasts, cities, stations; public domain and
# CC-BY-SA; Jupiter's clouds, a light tunnel and three strongly colour-shifted ones left out), the
# 15 photo faces of GNOME's and the 19 photo avatars of Plasma's user accounts (512 px, CC0) and
# 15 photo templates of Tux Paint. Written as `s_<folder>_<stem>.jpg` (spaces as `_`).
ENDLESS_SKY_LAND = "games/endless-sky/images/land"
ENDLESS_SKY_PHOTOS = tuple("""
    badlands0 badlands1 badlands2 badlands3 badlands4 badlands5 badlands6 badlands7 badlands8
    badlands9-harro beach0 beach1 beach10-sfiera beach11-harro beach12-harro beach2 beach3
    beach4 beach5 beach6 beach7-sfiera beach8-sfiera beach9-sfiera bwerner0 bwerner1 bwerner2
    bwerner3 bwerner4 bwerner5 bwerner6 bwerner7 bwerner8 canyon0 canyon01 canyon02 canyon03
    canyon04 canyon05 canyon1 canyon10-harro canyon2 canyon3 canyon4 canyon5 canyon6 canyon7
    canyon8 canyon9 city0 city1 city10 city11 city12 city13-sfiera city14-sfiera city15-sfiera
    city16-sfiera city17-sfiera city18-iridium city2 city3 city4 city5 city6 city7 city8 city9
    desert0 desert1 desert10-harro desert2 desert3 desert4 desert5 desert6 desert7
    desert8-sfiera desert9-sfiera dmottl0 dmottl1 dmottl2 dmottl3 dmottl4 dmottl5 dune0 dune1
    dune2 dune3 dune4 dune5 dune6-harro earthrise fields0 fields1 fields10-sfiera
    fields11-sfiera fields12-sfiera fields13-sfiera fields2 fields3 fields4 fields5 fields6
    fields7 fields8 fields9 fog0 fog1 fog2 fog3 fog4 fog5 fog6 fog7 forest0 forest1 forest2
    forest3 forest4 forest5 hills0 hills1 hills2 hills3 hills5-sfiera hills6-sfiera
    hills7-harro industrial0-iridium lava0 lava1 lava2 lava3 lava4 lava5 lava6 lava7-sfiera
    loc0 loc1 loc2 mfield0 mfield1 mfield2 mfield3 mfield4 mfield5 mountain0 mountain1
    mountain10-sfiera mountain11-sfiera mountain12-sfiera mountain13-sfiera mountain14-sfiera
    mountain15-sfiera mountain16-striker mountain17-harro mountain18-harro mountain19-harro
    mountain20-harro mountain21-harro mountain22-spfld mountain23-spfld mountain24-spfld
    mountain25-spfld mountain3 mountain4 mountain5 mountain6 mountain7 mountain8 mountain9
    myrabella0 myrabella1 myrabella2 myrabella3 myrabella4 myrabella5 myrabella6 myrabella7
    myrabella8 nasa0 nasa1 nasa2 nasa3 nasa4 nasa5 nasa6 nasa7 sea0 sea1 sea10-sfiera
    sea11-sfiera sea12-sfiera sea13-sfiera sea14-sfiera sea15-harro sea16-harro sea17-harro
    sea2 sea3 sea4 sea5 sea6 sea7 sea8 sea9 sky0 sky1 sky2 sky3 sky4 sky5 sky6 sky7 sky8 sky9
    snow0 snow1 snow10-sfiera snow10 snow11-sfiera snow2 snow3 snow4 snow5 snow6 snow7 snow8
    snow9 space0 space1 space2 space3 space4 space5 space7 station0 station1 station2 station3
    station4 valley0 valley1 valley10-sfiera valley11-harro valley12-harro valley13-harro
    valley14-harro valley15-harro valley2 valley3 valley4 valley5 valley6 valley8 valley9
    water0 water1 water10-harro water11-harro water2 water3 water4 water5 water6 water7 water8
    water9
    """.split())
SCENES_PHOTOS = tuple(
    ("endless-sky-data", f"{ENDLESS_SKY_LAND}/{stem}.jpg") for stem in ENDLESS_SKY_PHOTOS
) + (
    ("gnome-control-center-data", "pixmaps/faces/bicycle.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/book.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/calculator.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/cat.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/coffee2.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/flower2.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/gamepad.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/guitar2.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/headphones.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/hummingbird.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/mountain.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/plane.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/surfer.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/tomatoes.jpg"),
    ("gnome-control-center-data", "pixmaps/faces/tree.jpg"),
    ("plasma-workspace-data", "plasma/avatars/photos/Air Balloon.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Astronaut.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Books.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Brushes.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Bulb.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Cat.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Chameleon.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Cocktail.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Dog.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Fish.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Gamepad.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Owl.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Pancakes.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Parrot.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Pencils.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Shuttle.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Soccer.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Sunflower.png"),
    ("plasma-workspace-data", "plasma/avatars/photos/Sushi.png"),
    ("tuxpaint-data", "tuxpaint/templates/cliff.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/corn_maze.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/jellyfish.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/lighthouse.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/mossy_log.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/ocean_waves.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/redwoods_above.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/rocks.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/sheep.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/spiders_web.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/sun_behind_clouds.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/sun_behind_leaves.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/trees_above.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/trees_at_dusk.jpg"),
    ("tuxpaint-data", "tuxpaint/templates/wool_mill_machine.jpg"),
)
SHARE_DIR = "/usr/share"  # where the packages put their files; --share_dir: an unpacked copy
CROSS_ROOT = SHARE_DIR
_IMAGE_EXTS = (".jpg", ".jpeg", ".png")


def _plasma_sources(root: str) -> list[tuple[str, str]]:
  out = []
  for name in PLASMA_PHOTOS:
    files = [
        f
        for f in glob.glob(os.path.join(root, name, "contents", "images", "*"))
        if f.lower().endswith(_IMAGE_EXTS)
    ]
    if files:  # the largest rendition: most pixels for high-resolution tests
      out.append((max(files, key=os.path.getsize), f"wall_{name}.jpg"))
  return out


def _opencv_sources(root: str) -> list[tuple[str, str]]:
  paths = [(os.path.join(root, n), n) for n in OPENCV_PHOTOS]
  return [(p, f"cv_{os.path.splitext(n)[0]}.jpg") for p, n in paths if os.path.isfile(p)]


def _mate_sources(root: str) -> list[tuple[str, str]]:
  if not os.path.isdir(root):
    return []
  names = sorted(n for n in os.listdir(root) if n.lower().endswith(_IMAGE_EXTS))
  return [(os.path.join(root, n), f"mate_{os.path.splitext(n)[0]}.jpg") for n in names]


def find_sources(
    plasma_dir: str = PLASMA_DIR, opencv_dir: str = OPENCV_DIR, mate_dir: str = MATE_DIR
) -> list[tuple[str, str]]:
  """(source path, output file name) of every listed photograph that is installed, in order."""
  return _plasma_sources(plasma_dir) + _opencv_sources(opencv_dir) + _mate_sources(mate_dir)


def lomiri_name(file_name: str) -> str:
  """The written name of a contest photo: its title without the author ('sunset_by_X.jpg' ->
  'lomiri_sunset.jpg')."""
  return f"lomiri_{file_name.split('_by_')[0]}.jpg"


def find_lomiri_sources(lomiri_dir: str = LOMIRI_DIR) -> list[tuple[str, str]]:
  """(source path, output file name) of every listed contest photograph that is installed."""
  paths = [(os.path.join(lomiri_dir, n), n) for n in LOMIRI_PHOTOS]
  return [(p, lomiri_name(n)) for p, n in paths if os.path.isfile(p)]


def cross_name(path: str) -> str:
  """The written name of a cross-source photo: 'x_' and its file's stem (the '_srgb8' suffix of
  libjxl's test photos dropped)."""
  stem = os.path.splitext(os.path.basename(path))[0].removesuffix("_srgb8")
  return f"x_{stem}.jpg"


def _installed(
    listed: Sequence[tuple[str, str]], root: str, name: Callable[[str], str]
) -> list[tuple[str, str]]:
  """(source path, output file name) of every listed (package, path under root) that is there."""
  paths = [os.path.join(root, rel) for _, rel in listed]
  return [(p, name(p)) for p in paths if os.path.isfile(p)]


def find_cross_sources(root: str = CROSS_ROOT) -> list[tuple[str, str]]:
  """(source path, output file name) of every listed cross-source photograph that is installed."""
  return _installed(CROSS_PHOTOS, root, cross_name)


def people_name(path: str) -> str:
  """The written name of a people photo: 'p_' and its file's stem."""
  return f"p_{os.path.splitext(os.path.basename(path))[0]}.jpg"


_PEOPLE_LISTED = tuple((package, rel) for package, rel, _ in PEOPLE_PHOTOS)


def find_people_sources(root: str = SHARE_DIR) -> list[tuple[str, str]]:
  """(source path, output file name) of every listed people photograph that is installed."""
  return _installed(_PEOPLE_LISTED, root, people_name)


def _folder_and_stem(path: str) -> str:
  """'<folder>_<stem>' of a file, spaces as '_': the folder keeps two templates' `moon.jpg`, and
  GNOME's `cat.jpg` and Plasma's `Cat.png` on a case-blind file system, apart."""
  folder = os.path.basename(os.path.dirname(path))
  stem = os.path.splitext(os.path.basename(path))[0].replace(" ", "_")
  return f"{folder}_{stem}"


def extra_name(path: str) -> str:
  """The written name of an extra photo: 'e_', its folder and its file's stem."""
  return f"e_{_folder_and_stem(path)}.jpg"


def scenes_name(path: str) -> str:
  """The written name of a scenes photo: 's_', its folder and its file's stem."""
  return f"s_{_folder_and_stem(path)}.jpg"


# The sets listed file by file under /usr/share: their (package, path) pairs and written names.
_LISTED_SETS = {
    "cross": (CROSS_PHOTOS, cross_name),
    "people": (_PEOPLE_LISTED, people_name),
    "extra": (EXTRA_PHOTOS, extra_name),
    "scenes": (SCENES_PHOTOS, scenes_name),
}


# The clockwise turn each written photo needs to stand upright, by its output name.
TURNS = {people_name(rel): turn for _, rel, turn in PEOPLE_PHOTOS if turn}


# Each set's Debian packages, for the error when none of its photos is installed.
_SET_PACKAGES = {
    "photos": "plasma-workspace-wallpapers opencv-doc mate-backgrounds",
    "lomiri": "lomiri-wallpapers",
    **{
        name: " ".join(dict.fromkeys(package for package, _ in listed))
        for name, (listed, _) in _LISTED_SETS.items()
    },
}
# The sets a student is judged on, never trained on: no training source may be written into them.
TEST_ONLY_SETS = ("cross", "people")
MATE_PHOTO_COUNT = 12  # the photographs mate-backgrounds ships in MATE_DIR (all of them are used)
# What each set promises (the README quotes it): fewer installed is an error unless allowed.
PROMISED = {
    "photos": len(PLASMA_PHOTOS) + len(OPENCV_PHOTOS) + MATE_PHOTO_COUNT,
    "lomiri": len(LOMIRI_PHOTOS),
    **{name: len(listed) for name, (listed, _) in _LISTED_SETS.items()},
}


def _under(path: str, share_dir: str) -> str:
  """`path` (under /usr/share) moved under `share_dir`: a package unpacked with `dpkg-deb -x`
  instead of installed (launch/setup_photos.sh) has the same tree below another root."""
  return os.path.join(share_dir, os.path.relpath(path, SHARE_DIR))


def set_sources(photo_set: str, share_dir: str = SHARE_DIR) -> list[tuple[str, str]]:
  """(source path, output file name) of the set's installed photographs under `share_dir`."""
  if photo_set == "lomiri":
    return find_lomiri_sources(_under(LOMIRI_DIR, share_dir))
  if photo_set in _LISTED_SETS:
    listed, name = _LISTED_SETS[photo_set]
    return _installed(listed, share_dir, name)
  dirs = (_under(d, share_dir) for d in (PLASMA_DIR, OPENCV_DIR, MATE_DIR))
  return find_sources(*dirs)


def missing_packages(photo_set: str, share_dir: str = SHARE_DIR) -> list[str]:
  """The packages of `photo_set` whose photographs are not all installed."""
  if photo_set == "lomiri":
    found = find_lomiri_sources(_under(LOMIRI_DIR, share_dir))
    return [] if len(found) == len(LOMIRI_PHOTOS) else ["lomiri-wallpapers"]
  if photo_set in _LISTED_SETS:
    listed, _ = _LISTED_SETS[photo_set]
    absent = [p for p, rel in listed if not os.path.isfile(os.path.join(share_dir, rel))]
    return list(dict.fromkeys(absent))
  counts = (
      (
          "plasma-workspace-wallpapers",
          _plasma_sources(_under(PLASMA_DIR, share_dir)),
          PLASMA_PHOTOS,
      ),
      ("opencv-doc", _opencv_sources(_under(OPENCV_DIR, share_dir)), OPENCV_PHOTOS),
      ("mate-backgrounds", _mate_sources(_under(MATE_DIR, share_dir)), range(MATE_PHOTO_COUNT)),
  )
  return [name for name, found, promised in counts if len(found) < len(promised)]


def write_debian_photos(
    out_dir: str,
    *,
    max_side: int = 1920,
    sources: Sequence[tuple[str, str]] | None = None,
) -> list[str]:
  """Writes the installed photographs into out_dir as RGB JPEGs; returns the paths, sorted.

  Args:
    out_dir: destination folder (created); files of the same name are overwritten.
    max_side: the longer side of each written photo at most (photos are never enlarged).
    sources: (path, output name) pairs; default: `find_sources()`. A name in `TURNS` is turned
      upright (clockwise by its angle) before it is shrunk.

  Raises:
    FileNotFoundError: none of the three packages is installed.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top

  if max_side < 1:
    raise ValueError(f"max_side must be positive, got {max_side}")
  sources = find_sources() if sources is None else list(sources)
  if not sources:
    raise FileNotFoundError(
        "none of the photographs is installed: apt-get install plasma-workspace-wallpapers "
        f"opencv-doc mate-backgrounds (looked in {PLASMA_DIR}, {OPENCV_DIR}, {MATE_DIR})"
    )
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for src, name in sources:
    with Image.open(src) as im:
      im = im.convert("RGB")
      if TURNS.get(name):  # PIL turns counter-clockwise
        im = im.rotate(-TURNS[name], expand=True)
      scale = max_side / max(im.size)
      if scale < 1:
        size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
        im = im.resize(size, Image.Resampling.LANCZOS)
      path = os.path.join(out_dir, name)
      im.save(path, quality=95)
    paths.append(path)
  return sorted(paths)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m linvit_jax.data.debian_photos", description=__doc__.splitlines()[0]
  )
  parser.add_argument("out_dir")
  parser.add_argument(
      "--set",
      choices=sorted(_SET_PACKAGES),
      default="photos",
      help="photos: the default folder's (plasma, opencv, mate); lomiri: a disjoint set; cross: "
      "photos of five other packages, to test a student on sources it never trained on; people: "
      "photos of people from two more packages, a test-only folder; extra: 74 more training photos "
      "of seven other packages (Scratch's photographed backgrounds and more); scenes: 316 more of "
      "four others (Endless Sky's landscapes, account photos, Tux Paint's templates)",
  )
  parser.add_argument("--max_side", type=int, default=1920, help="longer side at most (px)")
  parser.add_argument(
      "--share_dir",
      default=SHARE_DIR,
      help="the packages' /usr/share: another folder for packages unpacked with dpkg-deb -x "
      "(launch/setup_photos.sh) instead of installed",
  )
  parser.add_argument(
      "--with_samples", action="store_true", help="also write the 21 sample photos (sample_photos)"
  )
  parser.add_argument(
      "--allow_partial",
      action="store_true",
      help="write the photographs that are installed even when some of the set's are missing",
  )
  return parser


def main(argv: list[str] | None = None) -> int:
  """The command line; a wrong argument or nothing installed is one `error:` line and exit 2."""
  args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
  try:
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
      raise UserError(f"OUT_DIR '{args.out_dir}' is a file, not a folder")
    if args.max_side < 1:
      raise UserError(f"--max_side must be positive, got {args.max_side}")
    if args.with_samples and args.set in TEST_ONLY_SETS:
      raise UserError(
          f"--with_samples puts the sample photos, a training source, into the '{args.set}' set, "
          "which only validates and tests: write them to the training folder instead"
      )
    try:
      paths = _write(args)
    except (ImportError, OSError) as e:  # a package missing, a file not writable
      raise errors.photo_writer_error(e) from e
  except UserError as e:
    return errors.say(e)
  print(f"wrote {len(paths)} photos to {args.out_dir}")
  return 0


def _write(args: argparse.Namespace) -> list[str]:
  """The set's installed photographs (and the samples) written to args.out_dir; their paths. An
  incomplete set is a UserError (nothing written) unless --allow_partial, then a warning."""
  sources = set_sources(args.set, args.share_dir)
  if not sources:
    raise UserError(
        f"none of the '{args.set}' photographs is installed: apt-get install "
        f"{_SET_PACKAGES[args.set]}"
    )
  promised, missing = PROMISED[args.set], missing_packages(args.set, args.share_dir)
  if len(sources) < promised and not args.allow_partial:
    raise UserError(
        f"only {len(sources)} of the {promised} '{args.set}' photographs are installed "
        f"(incomplete: {' '.join(missing)}); apt-get install {' '.join(missing)}, or pass "
        f"--allow_partial to write those {len(sources)} (another folder than the README's: "
        "its held-out split and figures differ); nothing was written"
    )
  paths = write_debian_photos(args.out_dir, max_side=args.max_side, sources=sources)
  if len(sources) < promised:
    print(
        f"WARNING: wrote {len(sources)} of the {promised} '{args.set}' photographs "
        f"(--allow_partial; not installed: {' '.join(missing)}): not the README's folder",
        file=sys.stderr,
    )
  if args.with_samples:
    from linvit_jax.data import sample_photos  # pylint: disable=g-import-not-at-top

    paths += sample_photos.write_sample_photos(args.out_dir)
  return paths


if __name__ == "__main__":
  sys.exit(main())
