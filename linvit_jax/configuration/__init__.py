"""The config schema as code. `config_lib`: the base config and one fixed-shape schema per stage
kind (every field in every run, off by its off value); `options`: a config file's `:arg` options
typed after their defaults; `recipes`: the blocks the shipped configs share; `config_checks`: the
shipped configs' option ranges and combinations, in one place; `reference`: every field with its
meaning (`--print_config`); `config_files`: finding `--config` files by name. The modules import
each other downwards only (config_lib at the bottom) and may import runtime only: models, data and
the driver read a config; it reads none of them.
"""
