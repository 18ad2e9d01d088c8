"""The config schema as code: `config_lib` (the run's ConfigDict and every option's default),
`config_checks` (ranges and combinations, one place) and `config_files` (finding `--config`
files). May import runtime only: models, data and the driver read a config; it reads none of
them.
"""
